# Sourced by the install-*.sh scripts (not run on its own): one Debian package that provides a command (by default
# of the same name), installed with apt-get when the command is missing and this runs as root on Debian. The package's
# service is never started or enabled (policy-rc.d 101 while apt-get runs): the tests run the binary as a plain
# process on loopback with a config of their own.
#   ensure_apt_package PACKAGE LOG [COMMAND]
# The caller defines `say` (messages to stderr) and `$cache`; apt-get's output goes to $cache/LOG. Returns 0 with
# the command on PATH; otherwise exits 3 naming what is missing or what failed.
ensure_apt_package() {
  local package=$1 log="$cache/$2" command=${3:-$1}
  if ! command -v "$command" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      say "installing Debian package $package"
      local start ok had_policy policy=/usr/sbin/policy-rc.d
      start=$(date +%s)
      had_policy=0; [ -e "$policy" ] && had_policy=1
      [ "$had_policy" = 1 ] || { printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; }
      ok=1
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
          "$package"; } >"$log" 2>&1 || ok=0
      [ "$had_policy" = 1 ] || rm -f "$policy"
      if [ "$ok" = 0 ]; then
        tail -20 "$log" >&2
        say "apt-get install $package failed (log above, full log $log)"
        exit 3
      fi
      say "installed in $(( $(date +%s) - start ))s"
    fi
  fi
  if ! command -v "$command" >/dev/null 2>&1; then
    say "missing: $command (Debian package $package). On Debian 12 as root: apt-get install $package"
    exit 3
  fi
}
