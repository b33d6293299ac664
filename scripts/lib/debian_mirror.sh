# scripts/lib/debian_mirror.sh — the Debian mirror this machine's apt uses (sourced, bash).
#
# The project writes no registry host of its own: where Debian's packages come from is the
# machine's choice (a local mirror, a proxy, a snapshot), made once in its apt sources. apt
# itself reads them, in every format it knows (one-line sources.list, sources.list.d/*.list,
# deb822 *.sources), and `apt-get indextargets --no-release-info` lists the repositories it
# would fetch, with or without `apt-get update` having run:
#
#   debian_mirror            the archive: the repository of the machine's own suite (on
#                            Debian 12 the one with Release bookworm), e.g. .../debian
#   debian_security_mirror   the repository of <suite>-security, e.g. .../debian-security
#
# OUTBOX_DEBIAN_MIRROR / OUTBOX_DEBIAN_SECURITY_MIRROR override them (a machine whose apt
# reads Debian through something these rules do not recognise). Both print the URI without a
# trailing slash, or fail saying what to set. Used by scripts/image (debootstrap), scripts/
# librdkafka (Debian's source package) and docker/Dockerfile's build stage (the same script,
# with the image's own apt sources).

# The machine's suite: VERSION_CODENAME of /etc/os-release (bookworm on Debian 12).
debian_codename() {
  local codename
  codename=$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")
  if [[ -z $codename ]]; then
    printf 'debian_mirror: /etc/os-release names no VERSION_CODENAME: not a Debian system?\n' >&2
    return 1
  fi
  printf '%s\n' "$codename"
}

# debian_repo_for_release RELEASE: the first repository apt is configured to fetch RELEASE of.
debian_repo_for_release() {
  local want=$1 uri release
  command -v apt-get >/dev/null 2>&1 || {
    printf 'debian_mirror: apt-get not found\n' >&2
    return 1
  }
  while read -r uri release; do
    if [[ $release == "$want" ]]; then
      printf '%s\n' "${uri%/}"
      return 0
    fi
  done < <(apt-get indextargets --no-release-info --format '$(REPO_URI) $(RELEASE)' 2>/dev/null)
  return 1
}

debian_mirror() {
  if [[ -n ${OUTBOX_DEBIAN_MIRROR:-} ]]; then
    printf '%s\n' "${OUTBOX_DEBIAN_MIRROR%/}"
    return 0
  fi
  local codename
  codename=$(debian_codename) || return 1
  debian_repo_for_release "$codename" || {
    printf 'debian_mirror: no apt source of this machine serves Debian %s (%s); %s\n' \
      "$codename" "apt-get indextargets" "set OUTBOX_DEBIAN_MIRROR to a Debian mirror's URI" >&2
    return 1
  }
}

debian_security_mirror() {
  if [[ -n ${OUTBOX_DEBIAN_SECURITY_MIRROR:-} ]]; then
    printf '%s\n' "${OUTBOX_DEBIAN_SECURITY_MIRROR%/}"
    return 0
  fi
  local codename
  codename=$(debian_codename) || return 1
  debian_repo_for_release "$codename-security" || {
    printf 'debian_mirror: no apt source of this machine serves %s-security; %s\n' \
      "$codename" "set OUTBOX_DEBIAN_SECURITY_MIRROR" >&2
    return 1
  }
}
