#!/usr/bin/env bash
# Build and cache the test guest: a Debian kernel from bookworm-backports
# (6.12: nbd.ko and ublk_drv.ko), a debootstrap minbase root packed as an ext4
# image, and a busybox initramfs that mounts that root and runs /run-test in
# it (scripts/guest/init, scripts/guest/run-test). scripts/guest/run.sh boots it.
#
#   scripts/guest/build.sh            # build what is missing or stale, print the cache
#   scripts/guest/build.sh --check    # only say whether the cached guest is complete (exit 0/1)
#   scripts/guest/build.sh --clean    # remove the built products (keeps the downloads)
#
# Re-runnable: every product is rebuilt only when missing or when its recipe
# (kernel version, package list, the init scripts) changed; downloads are kept.
# Needs root (debootstrap, files owned by root in the image) and, on the host,
# the Debian packages in HOST_TOOLS below (installed when missing, as root).
#
# Environment:
#   SQUEEZE_GUEST_CACHE    cache directory (default ~/.cache/squeeze-guest)
#   SQUEEZE_GUEST_MIRROR   Debian mirror (default: the host's apt source for bookworm)
#   SQUEEZE_GUEST_KERNEL   kernel package to use (default: what bookworm-backports'
#                          linux-image-amd64 depends on; kept once fetched)
#   SQUEEZE_GUEST_LOCK     a lock file held around the CPU-heavy steps (unpacking the
#                          root, packing the image), e.g. /tmp/bench.lock on a machine
#                          shared with benchmarks; unset: no lock. Do not also wrap
#                          this script in flock on the same file: it would wait on itself.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SQUEEZE_GUEST_CACHE:-${HOME:-/root}/.cache/squeeze-guest}
SUITE=bookworm
ARCH=amd64
# Packages of the root, beyond minbase. squeeze's release binary links glibc,
# libgcc_s and (built with ISA-L) libisal.so.2; run.sh checks its ldd against
# the root's libraries before booting. fuse3 brings fusermount3 for the FUSE
# export (serve --fuse-dir; the kernel has FUSE built in), which
# bench/guest/path.sh measures. A change to this list rebuilds the root.
GUEST_PACKAGES=nbd-client,fio,e2fsprogs,util-linux,kmod,procps,libisal2,fuse3
# Modules the initramfs loads to reach the root and the 9p shares; the root
# holds every module of the kernel (modprobe nbd, ublk_drv, loop, ... in tests).
INITRD_MODULES="virtio_blk ext4 crc32c_generic 9pnet_virtio 9p"
HOST_TOOLS="qemu-system-x86_64:qemu-system-x86 debootstrap:debootstrap busybox:busybox-static
  cpio:cpio depmod:kmod modprobe:kmod xz:xz-utils mkfs.ext4:e2fsprogs flock:util-linux
  dpkg-deb:dpkg apt-get:apt gzip:gzip"

log() { printf '[%(%H:%M:%S)T] guest-build: %s\n' -1 "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
# step NAME CMD...: run one step, say how long it took.
step() {
  local name=$1 t0=$SECONDS
  shift
  log "$name ..."
  "$@"
  log "$name: done in $((SECONDS - t0)) s"
}
# locked CMD...: CMD under $SQUEEZE_GUEST_LOCK when it is set.
locked() {
  [[ -n ${SQUEEZE_GUEST_LOCK:-} ]] || {
    "$@"
    return
  }
  local fd t0=$SECONDS rc=0
  exec {fd}>>"$SQUEEZE_GUEST_LOCK"
  flock "$fd"
  ((SECONDS - t0 < 2)) || log "waited $((SECONDS - t0)) s for $SQUEEZE_GUEST_LOCK"
  "$@" {fd}>&- || rc=$?
  exec {fd}>&-
  return "$rc"
}

mode=build
case ${1:-} in
  "") ;;
  --check) mode=check ;;
  --clean) mode=clean ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
  *) die "unknown argument '$1' (--check, --clean or none)" ;;
esac

# The products, and the recipe each was built from (rebuilt when it differs).
KDIR=$CACHE/kernel           # vmlinuz, config, lib/modules/KVER, package name
ROOT_TGZ=$CACHE/downloads/root-$SUITE.tgz
ROOT_IMG=$CACHE/root.img
ROOT_LIBS=$CACHE/root.libs   # the root's shared libraries, for run.sh's ldd check
INITRD=$CACHE/initrd.gz
recipe_root() { printf 'suite=%s packages=%s kernel=%s\n' "$SUITE" "$GUEST_PACKAGES" "$(cat "$KDIR/package" 2>/dev/null)"; }
recipe_initrd() {
  {
    printf 'kernel=%s modules=%s\n' "$(cat "$KDIR/package" 2>/dev/null)" "$INITRD_MODULES"
    cat "$HERE/init" "$HERE/run-test"
  } | sha256sum | cut -d' ' -f1
}
fresh() { # fresh PRODUCT RECIPE: the product exists and was built from RECIPE
  [[ -e $1 && -e $1.recipe && "$(cat "$1.recipe")" == "$2" ]]
}
complete() {
  [[ -s $KDIR/vmlinuz && -d $KDIR/lib/modules ]] &&
    fresh "$ROOT_IMG" "$(recipe_root)" && fresh "$INITRD" "$(recipe_initrd)"
}

if [[ $mode == check ]]; then
  if complete; then
    echo "guest complete in $CACHE (kernel $(cat "$KDIR/package"))"
    exit 0
  fi
  echo "guest incomplete or stale in $CACHE: run scripts/guest/build.sh" >&2
  exit 1
fi
if [[ $mode == clean ]]; then
  rm -rf "$KDIR" "$ROOT_IMG" "$ROOT_IMG.recipe" "$ROOT_LIBS" "$INITRD" "$INITRD.recipe" "$CACHE/root.tmp" "$CACHE/initrd.tmp"
  log "removed the built products from $CACHE (downloads kept in $CACHE/downloads)"
  exit 0
fi

T_ALL=$SECONDS
[[ $(uname -m) == x86_64 ]] || die "the guest is x86_64 and this host is $(uname -m)"

# --- host packages ---------------------------------------------------------
host_tools() {
  local t missing=()
  for t in $HOST_TOOLS; do
    command -v "${t%%:*}" >/dev/null 2>&1 || missing+=("${t##*:}")
  done
  # The initramfs needs a static busybox (Debian's busybox-static).
  if command -v busybox >/dev/null && ldd "$(command -v busybox)" >/dev/null 2>&1; then
    missing+=(busybox-static)
  fi
  ((${#missing[@]})) || return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  if [[ $(id -u) != 0 ]]; then
    die "missing host packages: ${missing[*]}. As root: apt-get update && apt-get install -y ${missing[*]}"
  fi
  log "installing host packages: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
    die "apt-get install ${missing[*]} failed"
}
[[ $(id -u) == 0 ]] || die "run as root: debootstrap and the image's root-owned files need it (and the host packages: $(for t in $HOST_TOOLS; do echo "${t##*:}"; done | sort -u | paste -sd' '))"
step "host packages" host_tools

# --- the Debian mirror -------------------------------------------------------
# The host's own apt source for $SUITE, so that the guest comes from where the
# host's packages come from (one-line .list and deb822 .sources).
host_mirror() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -r $f ]] || continue
    awk -v s="$SUITE" '$1 == "deb" { i = 2; if ($2 ~ /^\[/) while ($i !~ /\]$/) i++; if ($2 ~ /^\[/) i++;
      if ($(i + 1) == s) { print $i; exit } }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -r $f ]] || continue
    awk -v s="$SUITE" 'BEGIN { RS = ""; FS = "\n" }
      { uri = ""; ok = 0; deb = 0
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { split($i, a, /[ \t]+/); uri = a[2] }
          if ($i ~ /^Types:/ && $i ~ /(^|[ \t])deb([ \t]|$)/) deb = 1
          if ($i ~ /^Suites:/) { n = split($i, b, /[ \t]+/); for (j = 2; j <= n; j++) if (b[j] == s) ok = 1 } }
        if (ok && deb && uri != "") { print uri; exit } }' "$f"
  done
}
MIRROR=${SQUEEZE_GUEST_MIRROR:-$(host_mirror | head -n1)}
[[ -n $MIRROR ]] || die "no Debian mirror for $SUITE in the host's apt sources: set SQUEEZE_GUEST_MIRROR"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $KEYRING ]] || die "no $KEYRING (Debian's debian-archive-keyring package)"
log "cache $CACHE, mirror $MIRROR"
mkdir -p "$CACHE/downloads"

# --- the kernel --------------------------------------------------------------
# A private apt configuration (its own sources.list, state and cache under
# $CACHE/apt) reads bookworm-backports without touching the host's apt.
APT=$CACHE/apt
APT_OPTS=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=$APT/sources.list.d"
  -o "Dir::Etc::preferences=$APT/preferences" -o "Dir::Etc::preferencesparts=$APT/preferences.d"
  -o "Dir::State=$APT/state" -o "Dir::State::status=$APT/state/status" -o "Dir::Cache=$APT/cache"
  -o "APT::Architecture=$ARCH" -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
private_apt_update() {
  mkdir -p "$APT/sources.list.d" "$APT/preferences.d" "$APT/state/lists/partial" "$APT/cache/archives/partial"
  touch "$APT/state/status"
  echo "deb [signed-by=$KEYRING] $MIRROR $SUITE-backports main" >"$APT/sources.list"
  apt-get "${APT_OPTS[@]}" -qq update >&2
}
fetch_kernel() {
  local pkg=${SQUEEZE_GUEST_KERNEL:-} deb tmp kver
  if [[ -z $pkg ]]; then
    pkg=$(apt-cache "${APT_OPTS[@]}" show linux-image-amd64 2>/dev/null |
      sed -n 's/^Depends: \(linux-image-6\.12[^ ,]*-amd64\)\b.*/\1/p' | head -n1)
    [[ -n $pkg ]] || die "bookworm-backports has no linux-image-amd64 depending on a 6.12 kernel (set SQUEEZE_GUEST_KERNEL to a package name)"
  fi
  deb=$(find "$CACHE/downloads" -maxdepth 1 -name "${pkg}_*_$ARCH.deb" | head -n1)
  if [[ -z $deb ]]; then
    (cd "$CACHE/downloads" && apt-get "${APT_OPTS[@]}" -qq download "$pkg" >&2) ||
      die "could not download $pkg from $MIRROR $SUITE-backports"
    deb=$(find "$CACHE/downloads" -maxdepth 1 -name "${pkg}_*_$ARCH.deb" | head -n1)
  fi
  [[ -n $deb ]] || die "no .deb of $pkg in $CACHE/downloads after the download"
  tmp=$CACHE/kernel.tmp
  rm -rf "$tmp" && mkdir -p "$tmp/x"
  dpkg-deb -x "$deb" "$tmp/x"
  kver=$(basename "$(find "$tmp/x/lib/modules" -mindepth 1 -maxdepth 1 -type d | head -n1)")
  [[ -f $tmp/x/boot/vmlinuz-$kver ]] || die "$deb has no boot/vmlinuz-$kver"
  for m in nbd ublk_drv; do
    find "$tmp/x/lib/modules/$kver" -name "$m.ko*" | grep -q . || die "$pkg has no $m module"
  done
  mkdir -p "$tmp/k/lib/modules"
  mv "$tmp/x/boot/vmlinuz-$kver" "$tmp/k/vmlinuz"
  mv "$tmp/x/boot/config-$kver" "$tmp/k/config"
  mv "$tmp/x/lib/modules/$kver" "$tmp/k/lib/modules/"
  depmod -b "$tmp/k" "$kver"
  echo "$pkg" >"$tmp/k/package"
  echo "$kver" >"$tmp/k/release"
  rm -rf "$KDIR" && mv "$tmp/k" "$KDIR" && rm -rf "$tmp"
  log "kernel $pkg ($kver): $(du -sh "$KDIR/vmlinuz" | cut -f1) vmlinuz, $(du -sh "$KDIR/lib/modules" | cut -f1) of modules"
}
if [[ -s $KDIR/vmlinuz && -s $KDIR/package && -d $KDIR/lib/modules && ( -z ${SQUEEZE_GUEST_KERNEL:-} || $(cat "$KDIR/package") == "${SQUEEZE_GUEST_KERNEL:-}" ) ]]; then
  log "kernel: cached ($(cat "$KDIR/package"))"
else
  step "private apt update ($SUITE-backports)" private_apt_update
  step "kernel package" fetch_kernel
fi
KVER=$(cat "$KDIR/release")

# --- the root ----------------------------------------------------------------
# debootstrap downloads into a tarball once (network, little CPU), then unpacks
# and configures it (CPU: under the lock). The image is a sparse ext4 file made
# with mkfs.ext4 -d (no loop device, no mount); run.sh boots it with
# snapshot=on, so every run starts from the same root.
download_root() {
  local work=$CACHE/debootstrap.work
  rm -rf "$work" "$ROOT_TGZ.tmp"
  debootstrap --variant=minbase --arch="$ARCH" --include="$GUEST_PACKAGES" \
    --make-tarball="$ROOT_TGZ.tmp" "$SUITE" "$work" "$MIRROR" >"$CACHE/debootstrap-download.log" 2>&1 ||
    die "debootstrap --make-tarball failed: see $CACHE/debootstrap-download.log"
  mv "$ROOT_TGZ.tmp" "$ROOT_TGZ"
  echo "$GUEST_PACKAGES" >"$ROOT_TGZ.packages"
  rm -rf "$work"
}
unpack_root() {
  local r=$CACHE/root.tmp
  rm -rf "$r"
  locked debootstrap --variant=minbase --arch="$ARCH" --include="$GUEST_PACKAGES" \
    --unpack-tarball="$ROOT_TGZ" "$SUITE" "$r" "$MIRROR" >"$CACHE/debootstrap-unpack.log" 2>&1 ||
    die "debootstrap --unpack-tarball failed: see $CACHE/debootstrap-unpack.log"
}
customize_root() {
  local r=$CACHE/root.tmp
  rm -rf "$r/var/cache/apt/archives/"*.deb "$r/var/lib/apt/lists/"*_Packages "$r/var/log/"*.log
  mkdir -p "$r/lib/modules"
  cp -a "$KDIR/lib/modules/$KVER" "$r/lib/modules/"
  echo squeeze-guest >"$r/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 squeeze-guest\n' >"$r/etc/hosts"
  : >"$r/etc/fstab"
  mkdir -p "$r/mnt/in" "$r/mnt/out"
  # Libraries the root has, by soname, for run.sh's check of the binary.
  find "$r/lib" "$r/usr/lib" -maxdepth 2 -name '*.so*' -printf '%f\n' | sort -u >"$CACHE/root.libs.tmp"
}
pack_image() {
  local r=$CACHE/root.tmp used_mib size_mib
  used_mib=$(du -sm "$r" | cut -f1)
  # Room for the tests' volumes and scratch files: at least 3 GiB free. The
  # file is sparse, and writes go to qemu's snapshot overlay, not to it.
  size_mib=$((used_mib * 5 / 4 + 3072))
  rm -f "$ROOT_IMG.tmp"
  truncate -s "${size_mib}M" "$ROOT_IMG.tmp"
  locked mkfs.ext4 -q -F -L squeeze-root -E lazy_itable_init=1,lazy_journal_init=1 -d "$r" "$ROOT_IMG.tmp" ||
    die "mkfs.ext4 -d $r failed"
  mv "$ROOT_IMG.tmp" "$ROOT_IMG"
  mv "$CACHE/root.libs.tmp" "$ROOT_LIBS"
  recipe_root >"$ROOT_IMG.recipe"
  rm -rf "$r"
  log "root image $ROOT_IMG: ${size_mib} MiB (${used_mib} MiB used, sparse: $(du -sh "$ROOT_IMG" | cut -f1) on disk)"
}
if fresh "$ROOT_IMG" "$(recipe_root)" && [[ -s $ROOT_LIBS ]]; then
  log "root image: cached"
else
  if [[ -s $ROOT_TGZ && "$(cat "$ROOT_TGZ.packages" 2>/dev/null)" == "$GUEST_PACKAGES" ]]; then
    log "root packages: cached ($ROOT_TGZ)"
  else
    step "root packages (debootstrap --make-tarball)" download_root
  fi
  step "root unpack (debootstrap --unpack-tarball)" unpack_root
  step "root customize (modules, hostname)" customize_root
  step "root image (mkfs.ext4 -d)" pack_image
fi

# --- the initramfs -----------------------------------------------------------
# busybox, the boot modules (decompressed: busybox insmod hands the kernel a
# buffer, which it does not decompress), /init and /run-test.
pack_initrd() {
  local d=$CACHE/initrd.tmp m line f n=0
  rm -rf "$d" && mkdir -p "$d"/{bin,dev,proc,sys,newroot,lib/modules}
  cp "$(command -v busybox)" "$d/bin/busybox"
  ln -s busybox "$d/bin/sh" # /init installs the other applets
  : >"$d/modules.order"
  for m in $INITRD_MODULES; do
    modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" >"$d/deps" ||
      die "module $m: not in $KDIR/lib/modules/$KVER"
    while read -r line; do
      [[ $line == insmod\ * ]] || continue # builtin lines
      f=${line#insmod }
      f=${f%% *}
      n=$(basename "$f")
      n=${n%.xz}
      n=${n%.zst}
      grep -qx "$n" "$d/modules.order" && continue
      case $f in
        *.xz) xz -dc "$f" >"$d/lib/modules/$n" ;;
        *.zst) zstd -dcq "$f" >"$d/lib/modules/$n" ;;
        *) cp "$f" "$d/lib/modules/$n" ;;
      esac
      echo "$n" >>"$d/modules.order"
    done <"$d/deps"
  done
  rm -f "$d/deps"
  install -m 0755 "$HERE/init" "$d/init"
  install -m 0755 "$HERE/run-test" "$d/run-test"
  (cd "$d" && find . | LC_ALL=C sort | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  recipe_initrd >"$INITRD.recipe"
  log "initramfs $INITRD: $(du -h "$INITRD" | cut -f1), modules: $(tr '\n' ' ' <"$d/modules.order")"
  rm -rf "$d"
}
if fresh "$INITRD" "$(recipe_initrd)"; then
  log "initramfs: cached"
else
  step "initramfs" pack_initrd
fi

log "guest ready in $((SECONDS - T_ALL)) s: kernel $(cat "$KDIR/package"), $CACHE"
