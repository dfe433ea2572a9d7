#!/usr/bin/env bash
# Issue 52's on-machine A/B sessions at commit 0d46180 (the A/B gate's code as at 9038216): the
# sessions still missing from 20 A/A (half with a burner) and 10 drops after 9038216 and 7284618,
# interleaved. Run from /tmp/abexp4 holding clones of 0d46180 (base/, and slow10/ with its one
# commit setting LLMBENCH_SLOWDOWN's default to 0.1111).
export KINDS="aa+burn slow10 aa aa+burn slow10 aa aa+burn slow10 aa aa+burn slow10 aa aa+burn slow10 aa \
aa+burn slow10 aa aa+burn slow10"
WORK=${WORK:-/tmp/abexp4} exec bash "$(dirname "$0")/../9038216/run.sh"
