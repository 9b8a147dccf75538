#!/usr/bin/env bash
# The deduplication data set (issue 38): several Debian root file systems
# made with debootstrap, each with a different package set, packed as ext4
# images of one size, so that writing them one after another into a volume
# gives real, unplanned duplication (the same packages' files in each image,
# at different offsets) that nobody here wrote.
#
#   sudo bench/dedup_data.sh            # builds what is missing, prints the paths
#   DEDUP_DATA=/var/tmp/dedup-data IMAGE_SIZE=1536M sudo -E bench/dedup_data.sh
#
# Cached in $DEDUP_DATA (default /var/tmp/dedup-data): rootN.img and a
# recipe file; a image is rebuilt only when its recipe changed. Needs root
# (debootstrap, root-owned files in the image), debootstrap, mkfs.ext4 and
# a Debian mirror (SQUEEZE_GUEST_MIRROR, else deb.debian.org).
set -euo pipefail

DEDUP_DATA=${DEDUP_DATA:-/var/tmp/dedup-data}
IMAGE_SIZE=${IMAGE_SIZE:-1536M}
SUITE=${SUITE:-bookworm}
MIRROR=${SQUEEZE_GUEST_MIRROR:-http://deb.debian.org/debian}

die() { echo "dedup_data: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "run as root (debootstrap; root-owned files in the images)"
for t in debootstrap mkfs.ext4; do
  command -v "$t" >/dev/null || die "$t is missing (apt-get install debootstrap e2fsprogs)"
done
mkdir -p "$DEDUP_DATA"

# name|variant|extra packages: three package sets that share a base.
SETS=(
  "root1|minbase|"
  "root2|minbase|python3,perl,less,procps,iproute2"
  "root3|buildd|python3,git"
)

for s in "${SETS[@]}"; do
  IFS='|' read -r name variant include <<<"$s"
  img=$DEDUP_DATA/$name.img
  recipe="$SUITE $variant [$include] $IMAGE_SIZE $MIRROR"
  if [[ -f $img && -f $img.recipe && $(cat "$img.recipe") == "$recipe" ]]; then
    echo "$img (cached)"
    continue
  fi
  work=$DEDUP_DATA/$name.root
  rm -rf "$work" "$img" "$img.recipe"
  echo "dedup_data: debootstrap $name ($variant${include:+, $include}) ..." >&2
  debootstrap --variant="$variant" ${include:+--include="$include"} "$SUITE" "$work" "$MIRROR" \
    >"$DEDUP_DATA/$name.log" 2>&1 || die "debootstrap $name failed: see $DEDUP_DATA/$name.log"
  rm -rf "$work"/var/cache/apt/archives/*.deb
  # -E root_owner etc. are mkfs's defaults; -d copies the tree in.
  mkfs.ext4 -q -F -L "$name" -d "$work" "$img" "$IMAGE_SIZE" ||
    die "mkfs.ext4 -d failed for $name (is $IMAGE_SIZE too small? du -sh $work)"
  rm -rf "$work"
  echo "$recipe" >"$img.recipe"
  echo "$img"
done
