// The layer oracle: Go's own readers, as containerd and Docker read
// layers. A module of its own so that Kubernetes' versions never raise
// klauspost/compress here: it stays at what containerd v2.1.9 pins.
module kiln.test/layeroracle

go 1.24

require github.com/klauspost/compress v1.18.0
