#!/usr/bin/env bash
# Builds this system's UCX again from Debian's own source package, with Debian's configure flags
# and one change: assertions off (--disable-assertions), as UCX's release configuration and
# cluster builds (MLNX_OFED, HPC-X) have them. Debian's build keeps them on, and on the
# shared-memory path one of them loads, for every message received, the cache line the sender
# has just changed (src/net/ucx/README.md, "Measured"). Nothing of ferry's build uses the
# result: it is for measuring ferry and ucx_perftest against the UCX a cluster runs, by putting
# the prefix first on PATH and LD_LIBRARY_PATH (same version, same soname), for example
#   scripts/ucp-floor.sh --ucx system,build/ucx-noassert
#
# Usage: scripts/ucx-build.sh [--prefix build/ucx-noassert] [--assertions off|on] [--jobs N]
# --assertions on builds Debian's configuration unchanged (a control for the comparison).
# Needs Debian's source index (fetched into a private apt directory; the system's apt
# configuration is not changed; FERRY_DEBIAN_MIRROR names another mirror than deb.debian.org),
# gcc and make; installs dpkg-dev, autoconf, automake and libtool when missing. About three
# minutes here.
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=build/ucx-noassert assertions=off jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix|--assertions|--jobs)
      [ $# -ge 2 ] || { echo "ucx-build.sh: $1 needs a value (see --help)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --prefix) prefix=$2; shift 2 ;;
    --assertions) assertions=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "ucx-build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$assertions" in
  on|off) ;;
  *) echo "ucx-build.sh: --assertions takes on or off, not '$assertions'" >&2; exit 2 ;;
esac
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "ucx-build.sh: --jobs takes a positive integer, not '$jobs'" >&2; exit 2; }
[ -n "$prefix" ] || { echo "ucx-build.sh: --prefix takes a directory, not ''" >&2; exit 2; }
version=$(dpkg-query -W -f '${Version}' libucx0 2>/dev/null || true)
[ -n "$version" ] || { echo "ucx-build.sh: libucx0 is not installed (scripts/deps.sh installs it)" >&2; exit 1; }
# dpkg-source unpacks the package; Debian's tarball has no configure script, so autotools too.
missing=()
command -v dpkg-source > /dev/null || missing+=(dpkg-dev)
command -v autoreconf > /dev/null || missing+=(autoconf)
command -v automake > /dev/null || missing+=(automake)
command -v libtoolize > /dev/null || missing+=(libtool)
[ ${#missing[@]} -eq 0 ] || apt-get install -y -q "${missing[@]}"
for tool in gcc g++ make; do
  command -v "$tool" > /dev/null || { echo "ucx-build.sh: $tool is missing (apt-get install build-essential)" >&2; exit 1; }
done
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { echo "ucx-build.sh: /etc/os-release names no VERSION_CODENAME" >&2; exit 1; }
mirror=${FERRY_DEBIAN_MIRROR:-http://deb.debian.org/debian}

prefix=$(realpath -m "$prefix")
work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-ucx-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/parts" "$work/lists/partial" "$work/src"
cat > "$work/parts/debian-src.sources" <<EOF
Types: deb-src
URIs: $mirror
Suites: $codename
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
apt_private=(-q -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$work/parts"
             -o Dir::State::Lists="$work/lists" -o APT::Sandbox::User=root)
echo "ucx-build.sh: fetching Debian's source of ucx $version ($mirror, $codename)" >&2
apt-get "${apt_private[@]}" update > "$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; exit 1; }
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only "ucx=$version") > "$work/apt.log" 2>&1 ||
  { cat "$work/apt.log" >&2; echo "ucx-build.sh: Debian's source of ucx $version was not found" >&2; exit 1; }
# apt checked the files against Debian's signed index; dpkg-source's own check of the .dsc's
# signature needs debian-keyring, so its warning about that goes to the log.
(cd "$work/src" && dpkg-source -x ./*.dsc tree) > "$work/dpkg-source.log" 2>&1 || { cat "$work/dpkg-source.log" >&2; exit 1; }

# Debian's flags (debian/rules), without Java and with verbs only where its headers are.
flags=(--enable-mt --disable-backtrace-detail --disable-logging --enable-devel-headers --enable-examples --enable-cma
       --without-java --without-go)
if [ -f /usr/include/infiniband/verbs.h ]; then flags+=(--with-verbs); else flags+=(--without-verbs --without-rdmacm); fi
[ "$assertions" = off ] && flags+=(--disable-assertions)
echo "ucx-build.sh: configure ${flags[*]} --prefix=$prefix" >&2
cd "$work/src/tree"
[ -x configure ] || ./autogen.sh > "$work/autogen.log" 2>&1 || { tail -30 "$work/autogen.log" >&2; exit 1; }
./configure --prefix="$prefix" "${flags[@]}" > "$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
make -j"$jobs" > "$work/make.log" 2>&1 || { tail -30 "$work/make.log" >&2; exit 1; }
make install > "$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
state=$(LD_LIBRARY_PATH="$prefix/lib" "$prefix/bin/ucx_info" -b | grep -c 'define ENABLE_ASSERT' || true)
echo "ucx-build.sh: UCX $version in $prefix (assertions $assertions; ucx_info -b defines ENABLE_ASSERT: $state)" >&2
echo "ucx-build.sh: use it with PATH=$prefix/bin:\$PATH LD_LIBRARY_PATH=$prefix/lib" >&2
