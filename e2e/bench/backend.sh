# e2e/bench/backend.sh — sourced by the benchmark scripts: the backend every proxy under test
# forwards to, one nginx worker answering "ok" on loopback.
# shellcheck shell=bash disable=SC2016 # single-quoted $names are nginx's variables

# backend_conf DIR [PORT...]: writes DIR/backend.conf (pid in DIR) for an nginx that answers
# 200 "ok\n" on each 127.0.0.1:PORT (default 19080), with an X-Port header when there are
# several (so a test can tell which endpoint answered). With BACKEND_XFF_ECHO=1 it also answers
# /xff with the X-Forwarded-For it received (what a proxy under test sent as the client).
# With BACKEND_JSON_USAGE=1 it answers an LLM API's JSON instead of "ok\n":
# {"usage":{"total_tokens":1}} (application/json). With BACKEND_JSON_FILE=PATH it answers that
# file as application/json (a static file: Content-Length, ETag, Accept-Ranges).
backend_conf() {
  local dir=$1 port listens="" header="" echo="" answer='return 200 "ok\n";'
  shift
  [[ ${BACKEND_JSON_USAGE:-0} = 1 ]] &&
    answer="default_type application/json; return 200 '{\"usage\":{\"total_tokens\":1}}';"
  [[ -n ${BACKEND_JSON_FILE:-} ]] &&
    answer="default_type application/json; root $(dirname "$BACKEND_JSON_FILE"); try_files /$(basename "$BACKEND_JSON_FILE") =404;"
  for port in "${@:-19080}"; do listens+="    listen 127.0.0.1:$port;"$'\n'; done
  [[ $# -gt 1 ]] && header='add_header X-Port $server_port; '
  [[ ${BACKEND_XFF_ECHO:-0} = 1 ]] && echo='location = /xff { return 200 "$http_x_forwarded_for\n"; }'$'\n    '

  cat >"$dir/backend.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/backend.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_body_temp_path /tmp; proxy_temp_path /tmp; fastcgi_temp_path /tmp;
  uwsgi_temp_path /tmp; scgi_temp_path /tmp;
  server {
${listens}    ${echo}location / { ${header}${answer} }
  }
}
CONF
}
