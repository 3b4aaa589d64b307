# The nginx peer of the proxy benchmarks, one definition for every script that starts it
# (bench/run.sh, bench/burst-ab.sh, and bench/proxies.sh for the CPU benchmarks): a reverse
# proxy in front of one upstream with `proxy_buffering off` (each upstream chunk forwarded as it arrives, as
# capture does), HTTP/1.1 keep-alive to the upstream, and the listen backlog capture asks
# for (4,096; nginx's default of 511 overflows in a 1,000-connection burst).
#
# nginx_start DIR WORKERS LISTEN_PORT UPSTREAM_PORT: writes DIR/nginx.conf (pid and error
# log in DIR, an absolute path) and starts nginx on it in the background, in the foreground
# mode (`daemon off`), so the caller's `$!` is its master process.
nginx_start() {
  local dir=$1 workers=$2 port=$3 up=$4
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<NGINX
worker_processes $workers;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 8192; }
http {
  access_log off;
  upstream gt { server 127.0.0.1:$up; keepalive 2048; }
  server {
    listen 127.0.0.1:$port backlog=4096;
    location / {
      proxy_pass http://gt;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }
  }
}
NGINX
  nginx -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' 2>/dev/null &
}
