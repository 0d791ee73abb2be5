# tests/interop/guest.sh -- the QEMU guest the guest suites boot: a Debian kernel (the
# linux-image-amd64 .deb, extracted with dpkg -x, no install) and an initramfs of busybox,
# binaries with their libraries, the modules a suite names (dependency order resolved on the
# host by `modprobe --show-depends`), tests/interop/guest-lib.sh and the suite's own /init.
# Sourced (bash) by tests/interop/run.sh, tests/interop/secure.sh and tests/failover/run.sh.
#
# Two flavours:
#  - GUEST_SUITE unset: the host's own Debian. The kernel comes through the host's apt
#    sources, the binaries are the host's (nvme-cli, fio, ...).
#  - GUEST_SUITE=trixie (a Debian suite): kernel and userland come from that suite through a
#    private apt configuration in $GUEST_CACHE/apt (the host's /etc/apt is never read or
#    changed); guest_userland extracts packages and their dependencies into $GUEST_UROOT and
#    the binaries are taken from there (paths as inside that root), with its ld.so.
#    GUEST_USERLAND=host keeps that suite's kernel but takes the binaries from the host, as
#    in the first flavour (tests/failover/run.sh: trixie's fio pulls in ceph and gluster).
#
# Caller sets: GUEST_CACHE (holds dl/ and kroot/), FORCE (1: download and extract the kernel
# again, update the suite's package lists). Optional: GUEST_SUITE, GUEST_MIRROR. Its say, ts
# and el are tests/lib/harness.sh's (sourced here if the caller has not).
#
#   guest_setup [PKG...]          host apt packages ($GUEST_PKGS + PKG...) + the kernel, cached
#   guest_userland PKG...         (suite flavour) PKG and their dependencies into $GUEST_UROOT
#   guest_kver                    the extracted kernel's version (empty if none)
#   guest_stage IRD "MODS" BIN... a fresh initramfs tree: busybox, the binaries with their
#                                 libraries, MODS and their dependencies (etc/modules.list, in
#                                 load order, paths relative to lib/modules/KVER; .ko.xz
#                                 decompressed), etc/kver, etc/guest-lib.sh
#   guest_pack IRD INITRD         cpio newc of the tree
#   guest_stamp FILE...           what a cached initramfs was built from (compare to rebuild)

GUEST_SUITE=${GUEST_SUITE:-}
GUEST_USERLAND=${GUEST_USERLAND:-suite}
if [ -n "$GUEST_SUITE" ] && [ "$GUEST_USERLAND" != host ]; then
  GUEST_PKGS="qemu-system-x86 busybox-static cpio kmod python3 xz-utils"
else   # (a suite's kernel ships its modules as .ko.xz)
  GUEST_PKGS="qemu-system-x86 nvme-cli fio busybox-static cpio kmod python3${GUEST_SUITE:+ xz-utils}"
fi
GUEST_KROOT=$GUEST_CACHE/kroot          # dpkg -x of linux-image-*.deb
GUEST_UROOT=${GUEST_SUITE:+$GUEST_CACHE/uroot}
if [ "$GUEST_USERLAND" = host ]; then GUEST_UROOT=""; fi
GUEST_LIB=$(dirname "${BASH_SOURCE[0]}")/guest-lib.sh

# shellcheck source=tests/lib/harness.sh
declare -F say > /dev/null || . "$(dirname "${BASH_SOURCE[0]}")/../lib/harness.sh"

guest_kver() { ls "$GUEST_KROOT/lib/modules" 2> /dev/null | head -n1; }

# guest_apt CMD ARGS: apt-get / apt-cache, with the suite's private configuration if any
guest_apt() {
  if [ -n "$GUEST_SUITE" ]; then APT_CONFIG=$GUEST_CACHE/apt/apt.conf "$@"; else "$@"; fi
}

# guest_apt_init: the suite's private apt tree (sources, lists, an empty dpkg status so that
# apt resolves dependencies as for an empty system); lists updated when older than a day
guest_apt_init() {
  local a=$GUEST_CACHE/apt t
  mkdir -p "$a"/etc/apt.conf.d "$a"/etc/preferences.d "$a"/etc/sources.list.d \
    "$a"/state/lists/partial "$a"/cache/archives/partial
  : > "$a/state/status"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${GUEST_MIRROR:-http://deb.debian.org/debian} $GUEST_SUITE main" \
    > "$a/etc/sources.list"
  cat > "$a/apt.conf" <<EOF
Dir::Etc "$a/etc";
Dir::Etc::sourcelist "$a/etc/sources.list";
Dir::Etc::sourceparts "$a/etc/sources.list.d";
Dir::Etc::parts "$a/etc/apt.conf.d";
Dir::Etc::preferencesparts "$a/etc/preferences.d";
Dir::State "$a/state";
Dir::State::status "$a/state/status";
Dir::Cache "$a/cache";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Install-Recommends "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
  if [ "${FORCE:-0}" = 1 ] || [ -z "$(find "$a/state/lists" -maxdepth 1 -name '*_Packages' -mmin -1440 2> /dev/null)" ]; then
    t=$(ts); guest_apt apt-get update -qq || { echo "apt-get update ($GUEST_SUITE, private configuration $a) failed"; exit 1; }
    say "apt-get update ($GUEST_SUITE): $(el "$t") s"
  fi
}

# guest_setup [PKG...]: host apt packages (installed only if missing) + the Debian kernel
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
  [ -z "$GUEST_SUITE" ] || guest_apt_init
  if [ "${FORCE:-0}" != 1 ] && [ -f "$GUEST_KROOT/.extracted" ] && [ -n "$(guest_kver)" ] \
     && [ -f "$GUEST_KROOT/boot/vmlinuz-$(guest_kver)" ]; then
    say "kernel cached: $(cat "$GUEST_KROOT/.extracted")"
  else
    kpkg=$(guest_apt apt-cache depends linux-image-amd64 2> /dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    if [ -z "$kpkg" ] && [ -z "$GUEST_SUITE" ]; then
      $sudo apt-get update -qq
      kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    fi
    [ -n "$kpkg" ] || { echo "cannot resolve linux-image-amd64 to a kernel package"; exit 1; }
    deb=$(ls "$GUEST_CACHE"/dl/"$kpkg"_*.deb 2> /dev/null | head -n1 || true)
    if [ "${FORCE:-0}" = 1 ] || [ -z "$deb" ]; then
      t=$(ts)
      (cd "$GUEST_CACHE/dl" && rm -f linux-image-*.deb && guest_apt apt-get download -qq "$kpkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
      deb=$(ls "$GUEST_CACHE"/dl/"$kpkg"_*.deb 2> /dev/null | head -n1 || true)
      [ -n "$deb" ] || { echo "apt-get download $kpkg failed"; exit 1; }
      say "apt-get download $kpkg: $(el "$t") s"
    fi
    t=$(ts); rm -rf "$GUEST_KROOT"; dpkg -x "$deb" "$GUEST_KROOT"; say "dpkg -x: $(el "$t") s"
    # merged /usr (trixie): modules in usr/lib/modules, where kmod looks in lib/modules
    [ -e "$GUEST_KROOT/lib" ] || ln -s usr/lib "$GUEST_KROOT/lib"
    depmod -b "$GUEST_KROOT" "$(guest_kver)"            # the .deb ships no modules.dep
    echo "$kpkg $(dpkg-deb -f "$deb" Version)" > "$GUEST_KROOT/.extracted"
  fi
  {
    echo "kernel package: $(cat "$GUEST_KROOT/.extracted")"
    dpkg-query -W -f='${Package} ${Version}\n' qemu-system-x86 busybox-static $([ -n "$GUEST_UROOT" ] || echo nvme-cli libnvme1 fio)
  } > "$GUEST_CACHE/versions.txt"
  sed 's/^/  /' "$GUEST_CACHE/versions.txt"
  say "setup done in $(el "$t0") s"
}

# guest_userland PKG...: (suite flavour) PKG and the dependencies apt picks for an empty
# system, downloaded into the private cache and extracted (dpkg -x: no maintainer scripts)
# into $GUEST_UROOT; cached while the suite's versions of them stay the same
guest_userland() {
  local t a=$GUEST_CACHE/apt plan name ver f
  plan=$(guest_apt apt-get install -s -qq "$@" 2> /dev/null | awk '$1=="Inst"{v=$3; gsub(/[()]/, "", v); print $2 "_" v}' | sort)
  [ -n "$plan" ] || { echo "apt cannot install $* from $GUEST_SUITE (private configuration $a)"; exit 1; }
  if [ "${FORCE:-0}" != 1 ] && [ "$(cat "$GUEST_UROOT/.extracted" 2> /dev/null)" = "$plan" ]; then
    say "userland cached: $(echo "$plan" | wc -l) packages of $GUEST_SUITE for $*"
    return 0
  fi
  t=$(ts)
  guest_apt apt-get install -y -qq --download-only "$@" > /dev/null || { echo "apt-get --download-only $* failed"; exit 1; }
  rm -rf "$GUEST_UROOT"; mkdir -p "$GUEST_UROOT"
  for p in $plan; do
    name=${p%%_*}; ver=${p#*_}
    f=$(ls "$a/cache/archives/${name}_${ver/:/%3a}_"*.deb 2> /dev/null | head -n1)
    [ -n "$f" ] || { echo "no .deb for $name $ver in $a/cache/archives"; exit 1; }
    dpkg -x "$f" "$GUEST_UROOT"
  done
  for p in bin sbin lib lib64; do [ -e "$GUEST_UROOT/$p" ] || ln -s "usr/$p" "$GUEST_UROOT/$p"; done
  echo "$plan" > "$GUEST_UROOT/.extracted"
  say "userland: $(echo "$plan" | wc -l) packages of $GUEST_SUITE extracted in $(el "$t") s"
}

# guest_libs BIN: the libraries BIN loads, as paths on this machine (the host's ldd, or the
# suite root's own ld.so with its library directory first)
guest_libs() {
  if [ -n "$GUEST_UROOT" ]; then
    "$GUEST_UROOT/lib64/ld-linux-x86-64.so.2" --library-path "$GUEST_UROOT/usr/lib/x86_64-linux-gnu" --list "$1"
  else
    ldd "$1"
  fi | awk '/=> \//{print $3} /^\t\/lib/{print $1}'
}

# guest_copy_bin IRD BIN: a binary (absolute path on the host, or in $GUEST_UROOT) and the
# libraries it loads
guest_copy_bin() {
  local ird=$1 b=$2 lib rel r=$GUEST_UROOT
  install -D -m 0755 "$r$b" "$ird$b"
  guest_libs "$r$b" | while read -r lib; do
    rel=${lib#"$r"}
    [ -e "$ird$rel" ] || install -D -m 0755 "$(readlink -f "$r$rel")" "$ird$rel"
  done
}

# guest_stage IRD "MODULES" [BIN...]: a fresh tree (the caller then writes IRD/init)
guest_stage() {
  local ird=$1 mods=$2 K m p rel b; shift 2
  K=$(guest_kver)
  [ -n "$K" ] || { echo "no kernel under $GUEST_KROOT: run setup first"; return 1; }
  rm -rf "$ird"; mkdir -p "$ird"/{usr/bin,usr/sbin,proc,sys,dev,tmp,run,etc/nvme}
  if [ -n "$GUEST_UROOT" ]; then   # merged /usr, like the suite's own packages
    mkdir -p "$ird"/usr/lib "$ird"/usr/lib64
    for p in bin sbin lib lib64; do ln -s "usr/$p" "$ird/$p"; done
  else
    mkdir -p "$ird"/{bin,sbin,lib64}
  fi
  install -m 0755 "$(readlink -f "$(command -v busybox)")" "$ird/bin/busybox"
  for b in "$@"; do guest_copy_bin "$ird" "$b"; done
  : > "$ird/etc/modules.list"
  for m in $mods; do
    modprobe -d "$GUEST_KROOT" -S "$K" --show-depends "$m" 2> /dev/null | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++' | while read -r p; do
    rel=${p#"$GUEST_KROOT/lib/modules/$K/"}
    case $rel in
      *.ko.xz) rel=${rel%.xz}; mkdir -p "$(dirname "$ird/lib/modules/$K/$rel")"
               xz -dc "$p" > "$ird/lib/modules/$K/$rel";;   # busybox insmod takes plain .ko
      *) install -D -m 0644 "$p" "$ird/lib/modules/$K/$rel";;
    esac
    echo "$rel" >> "$ird/etc/modules.list"
  done
  echo "$K" > "$ird/etc/kver"
  install -m 0644 "$GUEST_LIB" "$ird/etc/guest-lib.sh"
}

# guest_pack IRD INITRD
guest_pack() {
  (cd "$1" && find . -print0 | cpio --null -o -H newc --quiet) > "$2.tmp"
  mv "$2.tmp" "$2"
}

# guest_stamp FILE...: the build inputs; an initramfs is rebuilt when they differ from the
# stamp saved beside it
guest_stamp() { cat "$@" "$GUEST_LIB" 2> /dev/null; }
