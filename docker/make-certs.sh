#!/usr/bin/env bash
# Create a private CA and a SuperLink TLS certificate signed by it.
#
#   docker/make-certs.sh OUT_DIR [SAN ...]
#
# SANs are the names and addresses SuperNodes and the flwr CLI use to reach the
# SuperLink, e.g. "DNS:superlink.example.org" "IP:10.0.0.1"; "DNS:localhost",
# "DNS:superlink" (the compose service) and "IP:127.0.0.1" are always included.
# Writes OUT_DIR/ca.crt (give it to every SuperNode and CLI user), ca.key (keep
# it offline), server.pem and server.key (the SuperLink's). Existing files are
# never overwritten: delete them first to rotate. CERT_DAYS sets the validity
# (default 365 days). Refused: an OUT_DIR inside a git work tree that git does
# not ignore (write outside the project, e.g. ~/fedapp-credentials/certs, or into
# docker/credentials/), and one holding node keys (the CA key stays apart from
# what goes to devices).
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}
die() {
  echo "make-certs: $*" >&2
  exit 2
}
# Run a command quietly; show its output only if it fails.
quiet() {
  local log
  if ! log="$("$@" 2>&1)"; then
    printf '%s\n' "$log" >&2
    echo "make-certs: '$1 $2' failed; nothing was written" >&2
    exit 1
  fi
}
valid_ipv4() {
  local IFS=. octet
  local -a octets
  [[ "$1" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || return 1
  read -r -a octets <<<"$1"
  for octet in "${octets[@]}"; do
    ((10#$octet <= 255)) || return 1
  done
}
valid_ipv6() {
  [[ "$1" == *:*:* && "$1" =~ ^[0-9A-Fa-f:]+$ ]]
}
valid_dns() {
  local label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
  [[ ${#1} -le 253 && "$1" =~ ^(\*\.)?$label(\.$label)*$ ]]
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  "") usage >&2; exit 2 ;;
esac
out="$1"
shift
days="${CERT_DAYS:-365}"
[[ "$days" =~ ^[1-9][0-9]*$ ]] || die "CERT_DAYS must be a positive number of days, not '$days'"
sans="DNS:localhost,DNS:superlink,IP:127.0.0.1"
for san in "$@"; do
  case "$san" in
    DNS:*) valid_dns "${san#DNS:}" || die "'$san' is not a valid DNS name" ;;
    IP:*) valid_ipv4 "${san#IP:}" || valid_ipv6 "${san#IP:}" || die "'$san' is not a valid IP address" ;;
    *) die "SAN '$san' must look like DNS:name or IP:address" ;;
  esac
  sans="$sans,$san"
done

# shellcheck source-path=SCRIPTDIR source=credentials-folder.sh
source "$(dirname "$0")/credentials-folder.sh"
check_credentials_folder make-certs "$out" ca.key
if compgen -G "$out/*.pub" >/dev/null; then
  die "$out holds node keys (*.pub): the CA's private key must not sit with files that go to devices; use another folder"
fi
mkdir -p "$out"
for f in ca.crt ca.key server.pem server.key; do
  if [[ -e "$out/$f" ]]; then
    echo "make-certs: $out/$f exists; remove the old credentials first" >&2
    exit 1
  fi
done

# Build everything in a scratch folder next to the output and move it into place
# only once all steps succeeded, so a failure never leaves half a set behind.
umask 077
work="$(mktemp -d "$out/.make-certs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# Explicit extensions, so the result does not depend on the system openssl.cnf.
cat >"$work/ca.cnf" <<CNF
[req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
CN = fedapp CA
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
CNF
cat >"$work/server.ext" <<EXT
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = $sans
EXT

quiet openssl genrsa -out "$work/ca.key" 4096
quiet openssl req -x509 -new -config "$work/ca.cnf" -key "$work/ca.key" -sha256 -days "$days" -out "$work/ca.crt"
quiet openssl genrsa -out "$work/server.key" 4096
quiet openssl req -new -key "$work/server.key" -subj "/CN=fedapp SuperLink" -out "$work/server.csr"
quiet openssl x509 -req -in "$work/server.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
  -days "$days" -sha256 -extfile "$work/server.ext" -out "$work/server.pem"
quiet openssl verify -CAfile "$work/ca.crt" "$work/server.pem"

chmod 644 "$work/ca.crt" "$work/server.pem"
for f in ca.key server.key ca.crt server.pem; do
  mv "$work/$f" "$out/$f"
done
echo "CA: $out/ca.crt  SuperLink: $out/server.pem $out/server.key  SANs: $sans"
