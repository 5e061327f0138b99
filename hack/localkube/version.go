package main

// version is the Kubernetes release this binary is built from; hack/localkube/build.sh keys its cache on it.
const version = "v1.35.4"
