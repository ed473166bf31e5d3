#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Makes the certificates the TLS tests use, with the openssl CLI, in DIR:
#   ca.pem ca.key          the job's CA
#   other-ca.pem           another CA (a client that trusts it has the "wrong CA")
#   server.pem server.key  the store's certificate (CN localhost, SAN localhost, 127.0.0.1, and
#                          every IPv4 address in EXTRA_IPS, e.g. netns addresses)
#   server-expired.pem     the same key, a certificate that expired in 2020
#   client.pem client.key  a client certificate signed by ca
#   client-expired.pem     the same key, expired
#   client-other.pem/.key  a client certificate signed by other-ca
# Usage: make_certs.sh DIR [EXTRA_IPS...]
set -euo pipefail
dir=$1; shift
mkdir -p "$dir"; cd "$dir"
san="DNS:localhost,IP:127.0.0.1"
for ip in "$@"; do san+=",IP:$ip"; done
q() { "$@" >/dev/null 2>&1 || { echo "make_certs: failed: $*" >&2; "$@"; exit 1; }; }
key() { q openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }
key ca.key; q openssl req -x509 -new -key ca.key -subj "/CN=ebbflow test CA" -days 3650 -out ca.pem
key other-ca.key; q openssl req -x509 -new -key other-ca.key -subj "/CN=another CA" -days 3650 -out other-ca.pem
cat > ext.cnf <<EXT
[srv]
subjectAltName=$san
extendedKeyUsage=serverAuth,clientAuth
[cli]
extendedKeyUsage=clientAuth
EXT
# A minimal `openssl ca` set-up: it can back-date a certificate (x509 -req cannot in OpenSSL 3.0).
mkdir -p ca.db; : > ca.db/index.txt; echo 01 > ca.db/serial
cat > ca.cnf <<CNF
[ca]
default_ca=c
[c]
dir=.
database=ca.db/index.txt
serial=ca.db/serial
new_certs_dir=ca.db
certificate=ca.pem
private_key=ca.key
default_md=sha256
policy=p
unique_subject=no
copy_extensions=none
[p]
commonName=supplied
CNF
sign() {  # sign CSR OUT SECTION [expired]
  if [[ ${4:-} == expired ]]; then
    q openssl ca -batch -config ca.cnf -in "$1" -out "$2" -extfile ext.cnf -extensions "$3" \
      -startdate 20200101000000Z -enddate 20200102000000Z -notext
  else
    q openssl x509 -req -in "$1" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 -out "$2" \
      -extfile ext.cnf -extensions "$3"
  fi
}
key server.key; q openssl req -new -key server.key -subj "/CN=localhost" -out server.csr
sign server.csr server.pem srv; sign server.csr server-expired.pem srv expired
key client.key; q openssl req -new -key client.key -subj "/CN=worker" -out client.csr
sign client.csr client.pem cli; sign client.csr client-expired.pem cli expired
key client-other.key; q openssl req -new -key client-other.key -subj "/CN=stranger" -out client-other.csr
q openssl x509 -req -in client-other.csr -CA other-ca.pem -CAkey other-ca.key -CAcreateserial -days 3650 \
  -out client-other.pem -extfile ext.cnf -extensions cli
# etcd takes the server pair as peer and client certificates.
echo "make_certs: certificates in $dir"
