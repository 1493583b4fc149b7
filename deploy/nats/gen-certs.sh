#!/bin/sh
# Certificates for trying TLS to NATS with compose.tls.yaml (README "Security model" -> "TLS to
# NATS"): a private CA (ca.pem), the NATS nodes' certificate for nats-1, nats-2, nats-3,
# localhost and 127.0.0.1 (server-cert.pem, server-key.pem) and the jobsched services' client
# certificate (client-cert.pem, client-key.pem). In production use your own PKI's certificates
# with the same names and files. Keys are P-256, unencrypted, mode 0600. The CA's key is deleted
# once both certificates are signed (this directory is mounted into the NATS containers): to
# renew, run the script again, which makes a new CA.
#
#   deploy/nats/gen-certs.sh [DIR]     # DIR defaults to deploy/nats/certs; DAYS=365 valid
set -eu
dir=${1:-$(dirname "$0")/certs}
days=${DAYS:-365}
umask 077
mkdir -p "$dir"
cd "$dir"

key() {
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"
}

# issue NAME SUBJECT EXTENSION... : NAME-cert.pem and NAME-key.pem, signed by the CA
issue() {
  name=$1 subject=$2
  shift 2
  key "$name-key.pem"
  openssl req -new -key "$name-key.pem" -subj "$subject" -out "$name.csr"
  printf '%s\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
    authorityKeyIdentifier=keyid subjectKeyIdentifier=hash "$@" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca-key.pem -sha256 -days "$days" \
    -extfile "$name.ext" -out "$name-cert.pem" 2>/dev/null
  rm "$name.csr" "$name.ext"
}

key ca-key.pem
openssl req -x509 -new -key ca-key.pem -sha256 -days "$days" -subj /CN=jobsched-nats-ca \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
  -out ca.pem
issue server /CN=nats extendedKeyUsage=serverAuth \
  subjectAltName=DNS:nats-1,DNS:nats-2,DNS:nats-3,DNS:localhost,IP:127.0.0.1
issue client /CN=jobsched extendedKeyUsage=clientAuth
rm ca-key.pem
chmod 0644 ca.pem server-cert.pem client-cert.pem
echo "certificates in $(pwd)"
