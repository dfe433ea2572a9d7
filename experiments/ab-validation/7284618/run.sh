#!/usr/bin/env bash
# Issue 52's on-machine A/B sessions at commit 7284618: 9038216's script as it is, run from
# /tmp/abexp3 holding clones of 7284618 (base/, and slow10/ with its one commit setting
# LLMBENCH_SLOWDOWN's default to 0.1111).
WORK=/tmp/abexp3 exec bash "$(dirname "$0")/../9038216/run.sh"
