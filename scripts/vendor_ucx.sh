#!/usr/bin/env bash
# For machines that cannot install Debian's libucx-dev (no package access, no
# root): run this where apt works, copy the checkout (vendor/ included) over,
# and scripts/setup.sh builds against the unpacked UCX in vendor/ucx. The
# extension's rpath then finds UCX and its libnuma there at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p vendor/debs vendor/ucx
(cd vendor/debs && apt-get download libucx0 libucx-dev libnuma1 2>&1 | grep -v "unsandboxed" || true)
for deb in vendor/debs/*.deb; do dpkg -x "$deb" vendor/ucx; done
test -f vendor/ucx/usr/include/ucp/api/ucp.h
echo "[vendor_ucx] UCX unpacked in vendor/ucx; setup.sh uses it when libucx-dev is not installed"
