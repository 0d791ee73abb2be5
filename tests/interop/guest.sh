# tests/interop/guest.sh -- the QEMU guest both guest suites boot: Debian's kernel (the
# linux-image-amd64 .deb, extracted with dpkg -x, no install) and an initramfs of busybox,
# host binaries with their libraries, the modules a suite names (dependency order resolved
# on the host by `modprobe --show-depends`) and the suite's own /init. Sourced (bash) by
# tests/interop/run.sh and tests/failover/run.sh.
#
# Caller sets: GUEST_CACHE (holds dl/ and kroot/; shared by the suites), FORCE (1: download
# and extract the kernel again). Optional: say, ts, el (the caller's log helpers).
#
#   guest_setup [PKG...]          apt packages ($GUEST_PKGS + PKG...) + the kernel, cached
#   guest_kver                    the extracted kernel's version (empty if none)
#   guest_stage IRD "MODS" BIN... a fresh initramfs tree: busybox, the binaries with their
#                                 libraries, MODS and their dependencies (etc/modules.list, in
#                                 load order, paths relative to lib/modules/KVER), etc/kver
#   guest_pack IRD INITRD         cpio newc of the tree
#   guest_stamp FILE...           what a cached initramfs was built from (compare to rebuild)

GUEST_PKGS="qemu-system-x86 nvme-cli fio busybox-static cpio kmod python3"
GUEST_KROOT=$GUEST_CACHE/kroot          # dpkg -x of linux-image-*.deb

declare -F ts > /dev/null || ts() { date +%s.%N; }
declare -F el > /dev/null || el() { awk -v a="$1" -v b="$(ts)" 'BEGIN{printf "%.1f", b-a}'; }
declare -F say > /dev/null || say() { echo "[host $(date +%T)] $*"; }

guest_kver() { ls "$GUEST_KROOT/lib/modules" 2> /dev/null | head -n1; }

# guest_setup [PKG...]: apt packages (installed only if missing) + the Debian kernel
guest_setup() {
  local t0 t kpkg deb p missing="" pkgs="$GUEST_PKGS $*"; t0=$(ts)
  mkdir -p "$GUEST_CACHE/dl"
  export DEBIAN_FRONTEND=noninteractive
  for p in $pkgs; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  local sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo -E"
  if [ -n "$missing" ]; then
    t=$(ts); $sudo apt-get update -qq; say "apt-get update: $(el "$t") s"
    # shellcheck disable=SC2086   # a list of package names
    t=$(ts); $sudo apt-get install -y -qq --no-install-recommends $missing > /dev/null
    say "apt-get install$missing: $(el "$t") s"
  else
    say "packages present: $pkgs"
  fi
  if [ "${FORCE:-0}" != 1 ] && [ -f "$GUEST_KROOT/.extracted" ] && [ -n "$(guest_kver)" ] \
     && [ -f "$GUEST_KROOT/boot/vmlinuz-$(guest_kver)" ]; then
    say "kernel cached: $(cat "$GUEST_KROOT/.extracted")"
  else
    kpkg=$(apt-cache depends linux-image-amd64 2> /dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    if [ -z "$kpkg" ]; then
      $sudo apt-get update -qq
      kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    fi
    [ -n "$kpkg" ] || { echo "cannot resolve linux-image-amd64 to a kernel package"; exit 1; }
    deb=$(ls "$GUEST_CACHE"/dl/"$kpkg"_*.deb 2> /dev/null | head -n1 || true)
    if [ "${FORCE:-0}" = 1 ] || [ -z "$deb" ]; then
      t=$(ts)
      (cd "$GUEST_CACHE/dl" && rm -f linux-image-*.deb && apt-get download -qq "$kpkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
      deb=$(ls "$GUEST_CACHE"/dl/"$kpkg"_*.deb 2> /dev/null | head -n1 || true)
      [ -n "$deb" ] || { echo "apt-get download $kpkg failed"; exit 1; }
      say "apt-get download $kpkg: $(el "$t") s"
    fi
    t=$(ts); rm -rf "$GUEST_KROOT"; dpkg -x "$deb" "$GUEST_KROOT"; say "dpkg -x: $(el "$t") s"
    depmod -b "$GUEST_KROOT" "$(guest_kver)"            # the .deb ships no modules.dep
    echo "$kpkg $(dpkg-deb -f "$deb" Version)" > "$GUEST_KROOT/.extracted"
  fi
  {
    echo "kernel package: $(cat "$GUEST_KROOT/.extracted")"
    dpkg-query -W -f='${Package} ${Version}\n' qemu-system-x86 nvme-cli libnvme1 busybox-static fio
  } > "$GUEST_CACHE/versions.txt"
  sed 's/^/  /' "$GUEST_CACHE/versions.txt"
  say "setup done in $(el "$t0") s"
}

# guest_copy_bin IRD BIN: an ELF binary of the host (absolute path) and the libraries ldd names
guest_copy_bin() {
  local ird=$1 b=$2 lib
  install -D -m 0755 "$b" "$ird$b"
  ldd "$b" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
    [ -e "$ird$lib" ] || install -D -m 0755 "$(readlink -f "$lib")" "$ird$lib"
  done
}

# guest_stage IRD "MODULES" [BIN...]: a fresh tree (the caller then writes IRD/init)
guest_stage() {
  local ird=$1 mods=$2 K m p rel b; shift 2
  K=$(guest_kver)
  [ -n "$K" ] || { echo "no kernel under $GUEST_KROOT: run setup first"; return 1; }
  rm -rf "$ird"; mkdir -p "$ird"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc/nvme,lib64}
  install -m 0755 "$(readlink -f "$(command -v busybox)")" "$ird/bin/busybox"
  for b in "$@"; do guest_copy_bin "$ird" "$b"; done
  : > "$ird/etc/modules.list"
  for m in $mods; do
    modprobe -d "$GUEST_KROOT" -S "$K" --show-depends "$m" 2> /dev/null | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r p; do
    rel=${p#"$GUEST_KROOT/lib/modules/$K/"}
    install -D -m 0644 "$p" "$ird/lib/modules/$K/$rel"
    echo "$rel" >> "$ird/etc/modules.list"
  done
  echo "$K" > "$ird/etc/kver"
}

# guest_pack IRD INITRD
guest_pack() {
  (cd "$1" && find . -print0 | cpio --null -o -H newc --quiet) > "$2.tmp"
  mv "$2.tmp" "$2"
}

# guest_stamp FILE...: the build inputs; an initramfs is rebuilt when they differ from the
# stamp saved beside it
guest_stamp() { cat "$@" 2> /dev/null; }
