//! The keyed hash's cost per value written (issue 54), for callgrind: `keyed_cost N` keys N
//! prefix-block values and N tool names; compare instruction counts at two N so setup cancels
//! (bench/README.md, "Keyed hashes against unkeyed").
fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let key = trace_format::keyed::HashKey::from_bytes(&[7u8; 32]);
    let mut acc = 0u64;
    for i in 0..n {
        acc ^= key.hash_u64(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
    for i in 0..n {
        acc ^= key.hash_bytes(format!("tool_{i}").as_bytes());
    }
    println!("{acc}");
}
