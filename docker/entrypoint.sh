#!/bin/sh
# Entry point of the platform image: read the secrets a program wants in its environment from
# their files (Docker secrets), then run the command. Nothing is printed: secrets stay out of
# logs. Sluice itself reads SLUICE_PRAVEGA_PASSWORD_FILE as a file and needs nothing here.
set -eu
# Files Sluice, Dagster and Spark write here are owner-only unless SLUICE_GROUP_READ is set
# (the `sluice` command sets the same umask itself; Dagster's processes take it from here).
case "${SLUICE_GROUP_READ:-0}" in
    1|true|yes|on) umask 027 ;;
    *) umask 077 ;;
esac
if [ -n "${DAGSTER_PG_PASSWORD_FILE:-}" ]; then
    if [ ! -r "$DAGSTER_PG_PASSWORD_FILE" ]; then
        echo "sluice-entrypoint: cannot read DAGSTER_PG_PASSWORD_FILE=$DAGSTER_PG_PASSWORD_FILE" >&2
        exit 64
    fi
    DAGSTER_PG_PASSWORD="$(cat "$DAGSTER_PG_PASSWORD_FILE")"
    export DAGSTER_PG_PASSWORD
fi
exec "$@"
