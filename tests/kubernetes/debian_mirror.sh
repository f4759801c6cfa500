# Sourced by the build scripts beside it. `debian_mirror` prints the Debian mirror the
# machine's apt already uses (deb822 .sources first, then sources.list), or Debian's
# default: the one place the build scripts look it up.
debian_mirror() {
    local mirror
    mirror="$(sed -n 's/^URIs:[[:space:]]*\(http[^[:space:]]*\/debian\)\/\?$/\1/p' \
        /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)"
    [ -n "$mirror" ] || mirror="$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\(http[^[:space:]]*\/debian\)\/\?[[:space:]].*/\2/p' \
        /etc/apt/sources.list 2>/dev/null | head -1)"
    echo "${mirror:-http://deb.debian.org/debian}"
}
