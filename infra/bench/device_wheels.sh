#!/usr/bin/env bash
# The server's Python packages for a GPU machine that has torch but no registry (Python 3.12,
# x86-64): the cp312 wheels of what its image lacks, unpacked into site/ and packed as one xz
# tarball, .whl/site.tar.xz (~43 MB), which h200_capacity.sh unpacks into /tmp/site. Run it
# here, where PyPI is reachable; .whl/ is ignored by git.
#
#   bash infra/bench/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PKGS=(
  msgspec==0.23.0 fastapi==0.165.0 starlette==1.10.0 pydantic==2.13.5 pydantic-core==2.46.5
  annotated-types==0.8.0 typing-inspection==0.4.5 opentelemetry-api==1.45.2
  importlib-metadata uvicorn==0.55.0 python-multipart==0.0.34 av==18.1.0
  aiortc==1.16.0 aioice==0.13.0 pyee==13.0.1 pylibsrtp==1.0.0 pyopenssl==26.4.0
  cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 google-crc32c==1.9.0 dnspython==2.9.2
  ifaddr==0.2.0 fa3-fwd==0.0.3
)
PLATFORMS=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
  manylinux_2_34 manylinux_2_35 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d "$work/wheels" "${PKGS[@]}"
mkdir -p "$work/site" .whl
for wheel in "$work"/wheels/*.whl; do
  python3 -m zipfile -e "$wheel" "$work/site"
done
tar cJf .whl/site.tar.xz -C "$work" site
ls -la .whl/site.tar.xz
