#!/bin/sh
# A python3 base image made from Debian's packages, for machines that reach apt but no
# container registry: debootstrap (minbase) + python3 + python3-venv + ca-certificates,
# committed into buildah's local storage. Pass it on as BASE_IMAGE (images/build.sh).
#   images/local-base.sh [IMAGE]        (root; needs debootstrap and buildah: make image-tools)
# The host's extra CA certificates (/usr/local/share/ca-certificates) go in too, and pip is
# pointed at the system bundle, so builds behind the same TLS-inspecting egress can reach PyPI.
set -eu
IMAGE=${1:-localhost/tianji-base:bookworm-py3.11}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
for tool in debootstrap buildah; do
  command -v "$tool" >/dev/null || { echo "local-base.sh: $tool missing (make image-tools)" >&2; exit 1; }
done
root=$(mktemp -d /var/tmp/tianji-base.XXXXXX)
ctr=""
cleanup() { [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true; rm -rf "$root"; }
trap cleanup EXIT
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$root" "$MIRROR"
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null
fi
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
tar -C "$root" -cf - . | tar -C "$mnt" -xpf -       # keeps owners, modes and links as debootstrap made them
buildah umount "$ctr" >/dev/null
buildah config --cmd /bin/sh \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 \
  --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
  --label org.opencontainers.image.description="Debian $SUITE minbase + python3 (debootstrap)" "$ctr"
buildah commit --rm "$ctr" "$IMAGE" >/dev/null
ctr=""
echo "$IMAGE"
