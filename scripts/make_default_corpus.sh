#!/usr/bin/env bash
# Rebuilds runtime/data/default_corpus.txt, kiln's built-in training corpus, from Debian 12
# packages (runtime/data/README.md says what is in it and why). A maintainer's script, not a
# build step: the corpus is committed, so that its bytes, and every loss measured on it, do
# not change with the packages on the machine that builds kiln. Needs apt (network) and
# writes only the corpus.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# bible-kjv holds the `bible` program that decompresses bible-kjv-text's data.
apt-get download bible-kjv bible-kjv-text dict-jargon dict-devil >/dev/null
for deb in *.deb; do dpkg-deb -x "$deb" root; done

# The licenses first and unchanged: tests take the corpus's first 8 KiB as a small corpus.
licenses=(GPL-3 GPL-2 LGPL-2.1 GFDL-1.3 MPL-2.0 Apache-2.0 CC0-1.0)
for l in "${licenses[@]}"; do cat "/usr/share/common-licenses/$l"; echo; done > corpus.txt
# The dictd files open with three lines of dictfmt metadata (format version, source URL, a
# "short name" tag); the text proper starts after them.
zcat root/usr/share/dictd/devil.dict.dz | tail -n +4 >> corpus.txt
zcat root/usr/share/dictd/jargon.dict.dz | tail -n +4 >> corpus.txt
# The whole King James Version, Genesis 1:1 to Revelation 22:21, wrapped at 80 columns. Last,
# so that the held-out tenth (--eval-every) is unseen text of the corpus's largest part.
LD_LIBRARY_PATH=root/usr/lib root/usr/bin/bible -p root/usr/lib -l80 "gen1:1-rev22:21" >> corpus.txt

install -m 644 corpus.txt "$repo/runtime/data/default_corpus.txt"
echo "wrote runtime/data/default_corpus.txt: $(stat -c %s corpus.txt) bytes, sha256 $(sha256sum corpus.txt | cut -d' ' -f1)"
