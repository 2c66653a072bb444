#!/usr/bin/env bash
# The Slurm REST API on a ParallelCluster head node, for `python -m training remote` on a laptop
# (stacks/shared/rest_api.py says why a token, and why in Secrets Manager): slurmrestd with JWT
# authentication on 127.0.0.1 only, which an SSM port forward reaches (no open port), and a token of the
# cluster's default user, renewed into the cluster stack's secret.
#
#   slurm-rest.sh install POINTER.json    the head node's bootstrap (on-node-configured.sh), as root
#   slurm-rest.sh token                   what the renewal timer runs (settings from rest.env)
#
# install, from the pointer's "rest" entry (token_secret, user, port, renew_minutes, lifespan_seconds):
# - the JWT key, 32 random bytes readable by SlurmUser alone (Slurm refuses a key others can read), in
#   the controller's state folder, which stays on the head node (compute nodes never hold it);
# - slurm.conf's AuthAltTypes=auth/jwt and the key, in a marked block (written again when a ParallelCluster
#   update rewrote the file), then slurmctld restarted to read it;
# - a system user slurmrestd (slurmrestd refuses to serve as root or SlurmUser);
# - the units scdino-slurmrestd.service and scdino-rest-token.timer (its first run at once), enabled.
# Every step is idempotent: OnNodeUpdated runs it again after each deploy.
set -euo pipefail

readonly SLURM_ROOT=${SCDINO_SLURM_ROOT:-/opt/slurm}
readonly CONF_FILE=${SCDINO_SLURM_CONF:-$SLURM_ROOT/etc/slurm.conf}
readonly STATE_DIR=${SCDINO_SLURM_STATE:-/var/spool/slurm.state}
readonly SYSTEMD_DIR=${SCDINO_SYSTEMD_DIR:-/etc/systemd/system}
readonly CONFIG_DIR=${SCDINO_REST_CONFIG_DIR:-/etc/scdino}
readonly INSTALLED=${SCDINO_REST_SCRIPT:-/usr/local/sbin/scdino-slurm-rest}
readonly REST_USER=slurmrestd
readonly BEGIN="# BEGIN scdino Slurm REST API (bootstrap/slurm-rest.sh)"
readonly END="# END scdino Slurm REST API"

log() { echo "[slurm-rest $(date -u +%FT%TZ)] $*"; }
die() { log "ERROR: $*"; exit 1; }

# The pointer's "rest" entry as shell assignments (REST_SECRET, REST_TOKEN_USER, REST_PORT, ...).
read_settings() {
  python3 - "$1" <<'PY'
import json, shlex, sys
rest = json.load(open(sys.argv[1])).get("rest")
if not rest:
    sys.exit("the pointer has no \"rest\" entry")
names = {"token_secret": "REST_SECRET", "user": "REST_TOKEN_USER", "port": "REST_PORT",
         "renew_minutes": "REST_RENEW_MINUTES", "lifespan_seconds": "REST_LIFESPAN"}
for key, name in names.items():
    if key not in rest:
        sys.exit(f"the pointer's rest entry lacks {key}")
    print(f"{name}={shlex.quote(str(rest[key]))}")
region = str(rest["token_secret"]).split(":")[3:4]
print(f"REST_REGION={shlex.quote(region[0] if region else '')}")
PY
}

slurm_user() { sed -n 's/^[[:space:]]*SlurmUser[[:space:]]*=[[:space:]]*\([^[:space:]#]*\).*/\1/p' "$CONF_FILE" | tail -n1; }

ensure_key() {
  local key=$1 owner=$2
  if [ ! -s "$key" ]; then
    log "creating the JWT key $key"
    (umask 077 && dd if=/dev/urandom of="$key.tmp" bs=32 count=1 status=none)
    mv "$key.tmp" "$key"
  fi
  chown "$owner:" "$key"
  chmod 0600 "$key"
}

# slurm.conf with our block (the key's path) in place of any earlier one; prints "changed" when it changed.
ensure_conf() {
  local key=$1 tmp
  tmp=$(mktemp)
  awk -v b="$BEGIN" -v e="$END" '$0==b{skip=1} !skip{print} $0==e{skip=0}' "$CONF_FILE" >"$tmp"
  printf '%s\n%s\n%s\n%s\n' "$BEGIN" "AuthAltTypes=auth/jwt" "AuthAltParameters=jwt_key=$key" "$END" >>"$tmp"
  if cmp -s "$tmp" "$CONF_FILE"; then
    rm -f "$tmp"
  else
    # in place: ParallelCluster's files keep their owner and mode
    cat "$tmp" >"$CONF_FILE"
    rm -f "$tmp"
    echo changed
  fi
}

# The slurmctld OpenAPI plugins this slurmrestd has: openapi/slurmctld from Slurm 23.02 on, the versioned
# ones before; the slurmdbd ones would stop it on a cluster without accounting.
openapi_plugins() {
  local listed
  # Listing only, as root: the daemon itself serves as slurmrestd (the unit's User=).
  listed=$(SLURMRESTD_SECURITY=disable_user_check SLURM_CONF="$CONF_FILE" "$SLURM_ROOT/sbin/slurmrestd" -s list 2>&1 |
    grep -o 'openapi/[a-z0-9.]*' || true)
  if grep -qx openapi/slurmctld <<<"$listed"; then
    echo openapi/slurmctld
  else
    grep -x 'openapi/v[0-9.]*' <<<"$listed" | sort -V | paste -sd, -
  fi
}

write_units() {
  local plugins=$1
  cat >"$SYSTEMD_DIR/scdino-slurmrestd.service" <<EOF
[Unit]
Description=Slurm REST API on 127.0.0.1:$REST_PORT for python -m training remote (scdino, bootstrap/slurm-rest.sh)
After=network-online.target slurmctld.service
Wants=network-online.target

[Service]
User=$REST_USER
Group=$REST_USER
Environment=SLURM_JWT=daemon
Environment=SLURM_CONF=$CONF_FILE
Environment=SLURMRESTD_OPENAPI_PLUGINS=$plugins
ExecStart=$SLURM_ROOT/sbin/slurmrestd -a rest_auth/jwt 127.0.0.1:$REST_PORT
Restart=on-failure
RestartSec=5

[Install]
WantedBy=multi-user.target
EOF
  cat >"$SYSTEMD_DIR/scdino-rest-token.service" <<EOF
[Unit]
Description=Renew the Slurm REST API token in Secrets Manager (scdino, bootstrap/slurm-rest.sh)
After=network-online.target slurmctld.service
Wants=network-online.target

[Service]
Type=oneshot
ExecStart=$INSTALLED token
EOF
  cat >"$SYSTEMD_DIR/scdino-rest-token.timer" <<EOF
[Unit]
Description=Renew the Slurm REST API token every $REST_RENEW_MINUTES minutes (scdino)

[Timer]
OnActiveSec=0
OnUnitActiveSec=${REST_RENEW_MINUTES}min

[Install]
WantedBy=timers.target
EOF
}

cmd_install() {
  local pointer=${1:?usage: $0 install POINTER.json} settings owner key plugins
  settings=$(read_settings "$pointer") || die "cannot read the REST API settings from $pointer"
  eval "$settings"
  [ -r "$CONF_FILE" ] || die "no Slurm configuration at $CONF_FILE: is this a ParallelCluster head node?"
  owner=$(slurm_user)
  owner=${owner:-root}
  key="$STATE_DIR/jwt_hs256.key"
  mkdir -p "$STATE_DIR" "$CONFIG_DIR"
  ensure_key "$key" "$owner"
  if [ "$(ensure_conf "$key")" = changed ]; then
    log "slurm.conf takes JWTs signed with $key: restarting slurmctld"
    systemctl restart slurmctld
  fi
  id -u "$REST_USER" >/dev/null 2>&1 || useradd --system --no-create-home --shell /sbin/nologin "$REST_USER"
  install -m 0755 "${BASH_SOURCE[0]}" "$INSTALLED"
  # What the timer's runs need; no secret in it (the token goes to Secrets Manager, never to a file here).
  printf '%s\n' "REST_SECRET=$REST_SECRET" "REST_TOKEN_USER=$REST_TOKEN_USER" "REST_LIFESPAN=$REST_LIFESPAN" \
    "REST_REGION=$REST_REGION" >"$CONFIG_DIR/rest.env"
  plugins=$(openapi_plugins)
  [ -n "$plugins" ] || die "$SLURM_ROOT/sbin/slurmrestd lists no slurmctld OpenAPI plugin (slurmrestd -s list)"
  write_units "$plugins"
  systemctl daemon-reload
  systemctl enable scdino-slurmrestd.service scdino-rest-token.timer
  systemctl restart scdino-slurmrestd.service scdino-rest-token.timer
  log "slurmrestd on 127.0.0.1:$REST_PORT ($plugins); token of $REST_TOKEN_USER renewed every $REST_RENEW_MINUTES min into $REST_SECRET"
}

# A token of the user, valid REST_LIFESPAN seconds, into the secret as {"token", "user", "expires"}: it
# travels from scontrol to the file through a pipe, never on a command line.
cmd_token() {
  local file
  # shellcheck source=/dev/null
  source "$CONFIG_DIR/rest.env"
  file=$(mktemp)
  # shellcheck disable=SC2064  # the name now: the variable is gone when the trap runs
  trap "rm -f -- '$file'" EXIT
  chmod 0600 "$file"
  "$SLURM_ROOT/bin/scontrol" token username="$REST_TOKEN_USER" lifespan="$REST_LIFESPAN" |
    python3 -c 'import json, sys, time
token = sys.stdin.read().strip().split("=", 1)[-1]
if not token:
    sys.exit("scontrol token printed no token")
json.dump({"token": token, "user": sys.argv[1], "expires": int(time.time()) + int(sys.argv[2])}, sys.stdout)' \
      "$REST_TOKEN_USER" "$REST_LIFESPAN" >"$file"
  aws secretsmanager put-secret-value --region "$REST_REGION" --secret-id "$REST_SECRET" \
    --secret-string "file://$file" --output text --query VersionId >/dev/null
  log "token of $REST_TOKEN_USER renewed in $REST_SECRET (valid $REST_LIFESPAN s)"
}

case "${1:-}" in
  install) cmd_install "${2:-}" ;;
  token) cmd_token ;;
  *) die "usage: $0 install POINTER.json | token" ;;
esac
