# shellcheck shell=bash
# Kovanex hook relay, shared by pre-receive and post-receive: they set KX_DATA,
# KX_PYTHON and KX_HOOKS, source this file (no extra process) and call kx_relay.
# Fast path: bash builtins only (no fork, no interpreter start), forwarding the
# ref updates, push options (and at pre-receive the quarantine path) to the warm
# local agent, which validates and answers. Slow path (agent down or silent):
# the same check in Python, same verdict.
#
# kx_relay PHASE WAIT_S REJECT_EXIT
#   PHASE        pre-receive | post-receive
#   WAIT_S       how long to wait for each line of the agent's answer
#   REJECT_EXIT  exit code when the agent says reject (post-receive cannot refuse:
#                the refs moved already, so it exits 0)
kx_relay() {
  local phase=$1 wait=$2 on_reject=$3 line l i v kind rest port token
  local -a lines=()
  while IFS= read -r line; do lines+=("$line"); done
  if [ -r "$KX_DATA/run/hook" ] && read -r port token <"$KX_DATA/run/hook" \
    && { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    {
      printf 'KOVANEX-HOOK 1 %s %s\n' "$token" "$phase"
      printf 'git_dir %s\n' "$PWD"
      if [ "$phase" = pre-receive ]; then
        printf 'quarantine %s\n' "${GIT_QUARANTINE_PATH:-}"
      fi
      # who pushed: githttp sets the committer ident to the token's name (ADR 0040)
      l=${GIT_COMMITTER_EMAIL:--} v=${GIT_COMMITTER_NAME:-}
      printf 'pusher %s %s\n' "${l//[$'\n' ]/_}" "${v//$'\n'/ }"
      # githttp's word on the credential: only a node may write refs/kovanex/
      printf 'via %s\n' "${KOVANEX_PUSH_VIA:-local}"
      i=0
      while [ "$i" -lt "${GIT_PUSH_OPTION_COUNT:-0}" ]; do
        v="GIT_PUSH_OPTION_$i"; printf 'opt %s\n' "${!v}"; i=$((i + 1))
      done
      for l in "${lines[@]}"; do printf 'ref %s\n' "$l"; done
      printf 'end\n'
    } >&3
    while read -r -t "$wait" kind rest <&3; do
      case "$kind" in
        msg) printf '%s\n' "$rest" >&2 ;;
        ok) exit 0 ;;
        reject) exit "$on_reject" ;;
      esac
    done
  fi
  printf '%s\n' "${lines[@]}" | exec "$KX_PYTHON" -I "$KX_HOOKS/kovanex_slowpath.py" "$phase" "$KX_DATA"
}
