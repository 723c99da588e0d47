#!/usr/bin/env bash
# Pack the wheels that fetch-vllm-wheels.sh downloaded (DEST/dl/*.whl) into one tar split into pieces that fit
# one device call each beside the repository's tracked files: the carry limit (64 MiB) is for the whole tree
# that travels, and the tracked files alone are ~24 MB now, so the 62 MB parts of fetch-vllm-wheels.sh no
# longer fit. Usage: pack_vllm_wheels.sh DEST [PIECE_BYTES]   (default: 64 MiB - tracked bytes - 2 MB).
# Writes DEST/p1 ... DEST/pN, one piece.K each; carry DEST/pI in call I, copying piece.* into /tmp/parts;
# exported_draft_serve.sh (phase serve) assembles, checks every wheel's sha256 and installs into /tmp/site.
set -euo pipefail
dest=${1:?usage: pack_vllm_wheels.sh DEST [PIECE_BYTES]}
tracked=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
piece=${2:-$((64 * 1024 * 1024 - tracked - 2000000))}
cd "$dest"
rm -rf pk p[0-9]*
mkdir -p pk
(cd dl && sha256sum ./*.whl) > pk/SHA256SUMS
tar cf - -C dl . -C .. pk/SHA256SUMS | split -b "$piece" -d -a 2 - piece.
n=0
for p in piece.*; do n=$((n + 1)); mkdir -p "p$n"; mv "$p" "p$n/"; done
echo "tracked files: $tracked bytes; $n pieces of at most $piece bytes"
du -sb p*
