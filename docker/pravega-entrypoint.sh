#!/bin/sh
# Entry point of the `pravega` service: Pravega standalone with the settings of compose.yaml
# (JAVA_OPTS), plus the internal auth password read from its secret file, so that it is not
# written in compose.yaml or shown by `docker inspect`. Then the image's own entry point.
set -eu
if [ "${PRAVEGA_AUTH:-false}" = "true" ]; then
    secret=/run/secrets/pravega_internal_password
    if [ ! -r "$secret" ]; then
        echo "pravega-entrypoint: PRAVEGA_AUTH=true needs the pravega_internal_password secret" >&2
        exit 64
    fi
    JAVA_OPTS="${JAVA_OPTS:-} -Dsinglenode.security.auth.credentials.pwd=$(cat "$secret")"
    export JAVA_OPTS
fi
exec /opt/pravega/scripts/entrypoint.sh "$@"
