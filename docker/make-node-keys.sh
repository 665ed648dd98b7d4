#!/usr/bin/env bash
# Create one ECDSA (NIST P-384) key pair per SuperNode, for node authentication.
#
#   docker/make-node-keys.sh OUT_DIR NAME [NAME ...]
#
# Writes OUT_DIR/NAME (private: stays on that SuperNode, passed as
# --auth-supernode-private-key) and OUT_DIR/NAME.pub (registered on the
# SuperLink with `flwr supernode register OUT_DIR/NAME.pub <connection>`).
# Existing keys are never overwritten; all names are checked before any key is
# written. Refused: an OUT_DIR inside a git work tree that git does not ignore,
# and one holding the CA's private key (ca.key).
set -euo pipefail

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

case "${1:-}" in
  -h | --help) usage; exit 0 ;;
esac
if [[ $# -lt 2 ]]; then
  usage >&2
  exit 2
fi
out="$1"
shift

declare -A seen=()
for name in "$@"; do
  if [[ ! "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ || "$name" == *.pub ]]; then
    echo "make-node-keys: node name '$name' must start with a letter or digit, use only letters, digits," \
      "'.', '_' and '-', and not end in .pub" >&2
    exit 2
  fi
  if [[ -n "${seen[$name]:-}" ]]; then
    echo "make-node-keys: node name '$name' is given twice" >&2
    exit 2
  fi
  seen[$name]=1
  for f in "$out/$name" "$out/$name.pub"; do
    if [[ -e "$f" ]]; then
      echo "make-node-keys: $f exists; remove it first to replace that node's key" >&2
      exit 1
    fi
  done
done

# shellcheck source-path=SCRIPTDIR source=credentials-folder.sh
source "$(dirname "$0")/credentials-folder.sh"
check_credentials_folder make-node-keys "$out" "$1"
if [[ -e "$out/ca.key" ]]; then
  echo "make-node-keys: $out holds the CA's private key (ca.key): node keys go to devices, so keep them apart" >&2
  exit 2
fi
mkdir -p "$out"
for name in "$@"; do
  ssh-keygen -q -t ecdsa -b 384 -N "" -C "fedapp-$name" -f "$out/$name" </dev/null
  echo "$name: private $out/$name  public $out/$name.pub"
done
