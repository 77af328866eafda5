#!/usr/bin/env bash
# CI entry point for the C ABI tests: builds the release staticlib, then
# builds and runs every C/C++ test plain and under ASan+UBSan.
# Honours CARGO_TARGET_DIR.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec make -C "$here" check
