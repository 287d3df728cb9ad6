#!/usr/bin/env python3
"""BATCH lines of LENGTH comma-separated random token ids below VOCAB, seeded by BATCH (the
same prompts every run): the prompts file of `kiln generate --prompts` that the decode
benchmarks feed (bench/generate_h200.sh, bench/profile_decode_h200.sh).

    python3 bench/random_prompts.py BATCH LENGTH [--vocab 32000] > prompts.txt"""
import argparse
import random
import sys


def prompts(batch, length, vocab=32000):
    rng = random.Random(batch)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("batch", type=int)
    parser.add_argument("length", type=int)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.length < 1 or args.vocab < 1:
        parser.error("BATCH, LENGTH and --vocab must be at least 1")
    for p in prompts(args.batch, args.length, args.vocab):
        print(",".join(map(str, p)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
