# shellcheck shell=bash
# Sourced by make-certs.sh and make-node-keys.sh: where private keys may be written.
#
#   check_credentials_folder SCRIPT OUT_DIR KEY_FILE
#
# Refuses (exit 2, one line, nothing written) an OUT_DIR inside a git work tree
# that git does not ignore: a private key there is one `git add .` away from a
# repository. KEY_FILE is the key the script writes, named as git would see it.
check_credentials_folder() {
  local script="$1" out="$2" key="$3" parent top
  parent="$out"
  while [[ ! -d "$parent" ]]; do parent="$(dirname "$parent")"; done
  command -v git >/dev/null || return 0
  top="$(git -C "$parent" rev-parse --show-toplevel 2>/dev/null)" || return 0
  local path
  path="$(cd "$parent" && pwd -P)/${out#"$parent"}"
  path="${path%/}/$key"
  if ! git -C "$top" check-ignore -q --no-index "$path"; then
    echo "$script: $out is inside the git work tree $top and git does not ignore it: private keys there could" \
      "be committed; write them outside the project (e.g. ~/fedapp-credentials) or into a git-ignored folder" \
      "(docker/credentials/)" >&2
    exit 2
  fi
}
