#!/usr/bin/env bash
# make audit: the dependency tree checked with cargo-deny (deny.toml):
# RustSec advisories, licences, duplicate/wildcard bans and sources.
#
# The advisory database: KILN_ADVISORY_DB, else ../shared/advisory-db beside
# the project when present (a dated snapshot; these machines cannot reach
# RustSec's repository), else cargo-deny fetches RustSec's own. A local
# database is copied into target/advisory-dbs as the git repository
# cargo-deny opens, committed with the database's own date, which is
# printed. Exit 1 on a finding; exit 2 when no database could be had.
set -euo pipefail
cd "$(dirname "$0")/.."
deny=${CARGO_DENY:-$(command -v cargo-deny || true)}
[ -n "$deny" ] || { echo "audit: cargo-deny is missing: run make deps" >&2; exit 1; }
"$deny" --version

src=${KILN_ADVISORY_DB:-}
if [ -z "$src" ] && [ -d ../shared/advisory-db/crates ]; then
  src=../shared/advisory-db
fi
# cargo-deny 0.18 keeps the database for its default URL under this name
# in db-path (deny.toml): it opens it as a git repository.
db=target/advisory-dbs/advisory-db-3157b0e258782691
fetch=()
if [ -n "$src" ]; then
  [ -d "$src/crates" ] || { echo "audit: $src holds no crates/ directory: not a RustSec advisory database" >&2; exit 2; }
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    date=$(git -C "$src" log -1 --format=%cs)
  else
    # The snapshot names its date in SNAPSHOT.md: "... at commit X (YYYY-MM-DD)".
    date=$(grep -m1 -oE '\(20[0-9]{2}-[0-9]{2}-[0-9]{2}\)' "$src/SNAPSHOT.md" 2>/dev/null | tr -d '()' || true)
    [ -n "$date" ] || date=$(find "$src/crates" -type f -printf '%TY-%Tm-%Td\n' | sort | tail -1)
  fi
  rm -rf "$db" && mkdir -p "$db"
  cp -R "$src/crates" "$db/"
  [ -d "$src/rust" ] && cp -R "$src/rust" "$db/"
  (
    cd "$db"
    git init -q
    git add -A
    GIT_AUTHOR_DATE="${date}T00:00:00Z" GIT_COMMITTER_DATE="${date}T00:00:00Z" \
      git -c user.name=kiln-audit -c user.email=kiln-audit@localhost \
      commit -q -m "RustSec advisory database from $src ($date)"
  )
  n=$(find "$db/crates" -name 'RUSTSEC-*.md' | wc -l)
  echo "audit: advisory database $src, dated $date ($n crate advisories); newer advisories are not in it"
  fetch=(--disable-fetch)
else
  echo "audit: no local advisory database (KILN_ADVISORY_DB, ../shared/advisory-db): cargo-deny fetches RustSec's"
fi

set +e
"$deny" check --hide-inclusion-graph "${fetch[@]}" advisories licenses bans sources
rc=$?
set -e
if [ -d "$db/.git" ] && [ ${#fetch[@]} -eq 0 ]; then
  echo "audit: advisory database fetched, dated $(git -C "$db" log -1 --format=%cs)"
fi
if [ $rc -ne 0 ] && [ ${#fetch[@]} -eq 0 ] && [ ! -d "$db/.git" ]; then
  echo "audit: no advisory database could be fetched: set KILN_ADVISORY_DB to a local copy" >&2
  exit 2
fi
exit $rc
