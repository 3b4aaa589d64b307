# The proxies the CPU benchmarks compare (bench/request-path-cpu.sh, bench/chunk-cpu.sh), one
# definition for both, a free port and the wait for a listener, and the per-process
# counters they read.
#
# proxy_start PATH DIR LISTEN_PORT UPSTREAM_PORT: starts the proxy PATH in the background, so
# the caller's `$!` is its pid. PATH: capture (--threads default: one per core) | capture1
# (--threads 1) | capture-b (the build $CAPTURE_B_BIN, for an A/B of two builds in one run)
# | nginx (one worker) | nginx2 (two workers). capture runs $CAPTURE_BIN; its log and trace
# go in DIR.
# shellcheck source=bench/nginx.sh
. "$(dirname "${BASH_SOURCE[0]}")/nginx.sh"

proxy_start() {
  local path=$1 d=$2 port=$3 up=$4
  case "$path" in
    nginx|nginx2)
      local workers=1; [ "$path" = nginx2 ] && workers=2
      nginx_start "$d" "$workers" "$port" "$up" ;;
    capture|capture1|capture-b)
      local threads=() cbin=$CAPTURE_BIN; [ "$path" = capture1 ] && threads=(--threads 1)
      [ "$path" = capture-b ] && cbin=${CAPTURE_B_BIN:?capture-b needs CAPTURE_B_BIN}
      "$cbin" capture --listen "127.0.0.1:$port" --upstream "http://127.0.0.1:$up" --out "$d/trace" --no-admin "${threads[@]}" 2>"$d/capture.log" & ;;
    *) echo "unknown path $path" >&2; exit 2 ;;
  esac
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > /dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; echo "nothing on $1" >&2; return 1; }
# Summed schedstat run time (ns) of every thread of the given processes.
cpu() { local p; for p in "$@"; do cat /proc/"$p"/task/*/schedstat 2>/dev/null || true; done | awk '{s += $1} END {printf "%d\n", s}'; }
# Summed voluntary context switches of every thread of the given processes.
vcs() { local p; for p in "$@"; do cat /proc/"$p"/task/*/status 2>/dev/null || true; done | awk '/^voluntary_ctxt_switches/ {s += $2} END {printf "%d\n", s}'; }
