// Command layeroracle lists what a layer holds as containerd and Docker
// read it: Go's own compress/gzip and archive/tar, and klauspost's zstd at
// the version containerd 2.1.9 pins. kiln's tests hand it every layer
// kiln's reader accepts and fail where the two listings differ.
//
// How containerd reads a layer (containerd v2.1.9,
// pkg/archive/compression/compression.go and core/diff/apply/apply.go):
// the compression is detected from the first bytes (gzip's magic, zstd's
// frame or skippable-frame magic), not from the media type; gzip goes
// through igzip or unpigz when one is on PATH, else compress/gzip
// (multistream, the default); zstd through zstd.NewReader with
// WithDecoderLowmem(false); the tar through archive/tar's Next until
// io.EOF; then the rest of the stream is read to its end and the diff ID
// is the SHA-256 of every decompressed byte.
//
// One process serves many layers: each request is a JSON line
// {"mediaType": "...", "size": N} followed by N bytes; each answer is one
// JSON line (see Listing).
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"

	"github.com/klauspost/compress/zstd"
)

type Request struct {
	MediaType string `json:"mediaType"`
	Size      int64  `json:"size"`
}

type Entry struct {
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Mode     int64             `json:"mode"`
	Uid      int               `json:"uid"`
	Gid      int               `json:"gid"`
	Size     int64             `json:"size"`
	Mtime    int64             `json:"mtime"`
	Linkname string            `json:"linkname"`
	Sha256   string            `json:"sha256"`
	Pax      map[string]string `json:"pax,omitempty"`
	Xattrs   []string          `json:"xattrs,omitempty"`
}

// Listing is one layer as Go reads it. Error is set when Go refuses it
// (the entries read before are kept); Compression is what containerd
// detects from the bytes; Unpigz, when unpigz is on PATH, is the SHA-256
// of what it decompressed (or its error), which must equal DiffID.
type Listing struct {
	Compression string  `json:"compression"`
	Entries     []Entry `json:"entries"`
	Trailing    int64   `json:"trailing"`
	DiffID      string  `json:"diffId"`
	Error       string  `json:"error,omitempty"`
	Unpigz      string  `json:"unpigz,omitempty"`
}

var (
	gzipMagic = []byte{0x1f, 0x8b, 0x08}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

func detect(b []byte) string {
	switch {
	case bytes.HasPrefix(b, gzipMagic):
		return "gzip"
	case bytes.HasPrefix(b, zstdMagic):
		return "zstd"
	case len(b) >= 8 && binary.LittleEndian.Uint32(b[:4])&0xFFFFFFF0 == 0x184D2A50:
		return "zstd"
	}
	return "none"
}

func decompress(how string, blob []byte) (io.Reader, func(), error) {
	switch how {
	case "gzip":
		r, err := gzip.NewReader(bytes.NewReader(blob))
		if err != nil {
			return nil, nil, err
		}
		return r, func() { r.Close() }, nil
	case "zstd":
		r, err := zstd.NewReader(bytes.NewReader(blob), zstd.WithDecoderLowmem(false))
		if err != nil {
			return nil, nil, err
		}
		return r, r.Close, nil
	}
	return bytes.NewReader(blob), func() {}, nil
}

func list(blob []byte, unpigz string) Listing {
	out := Listing{Compression: detect(blob), Entries: []Entry{}}
	r, done, err := decompress(out.Compression, blob)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	defer done()
	all := sha256.New()
	tr := tar.NewReader(io.TeeReader(r, all))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			out.Error = err.Error()
			return out
		}
		data := sha256.New()
		if _, err := io.Copy(data, tr); err != nil {
			out.Error = err.Error()
			return out
		}
		e := Entry{
			Name: h.Name, Type: string([]byte{h.Typeflag}), Mode: h.Mode,
			Uid: h.Uid, Gid: h.Gid, Size: h.Size, Mtime: h.ModTime.Unix(),
			Linkname: h.Linkname, Sha256: hex.EncodeToString(data.Sum(nil)),
		}
		if len(h.PAXRecords) > 0 {
			e.Pax = h.PAXRecords
		}
		//lint:ignore SA1019 Xattrs is what older readers still apply.
		for k := range h.Xattrs { //nolint:staticcheck
			e.Xattrs = append(e.Xattrs, k)
		}
		sort.Strings(e.Xattrs)
		out.Entries = append(out.Entries, e)
	}
	// What containerd reads past the archive's end, into the diff ID.
	n, err := io.Copy(all, r)
	out.Trailing = n
	if err != nil {
		out.Error = err.Error()
		return out
	}
	// As containerd: every decompressed byte, the archive's and the rest's.
	out.DiffID = "sha256:" + hex.EncodeToString(all.Sum(nil))
	if out.Compression == "gzip" && unpigz != "" {
		out.Unpigz = viaCommand(unpigz, blob)
	}
	return out
}

func viaCommand(path string, blob []byte) string {
	cmd := exec.Command(path, "-d", "-c")
	cmd.Stdin = bytes.NewReader(blob)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Sprintf("error: %v: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	sum := sha256.Sum256(stdout.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:])
}

func main() {
	unpigz := ""
	if p, err := exec.LookPath("unpigz"); err == nil {
		unpigz = p
	}
	in := bufio.NewReader(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	enc := json.NewEncoder(out)
	for {
		line, err := in.ReadBytes('\n')
		if errors.Is(err, io.EOF) && len(line) == 0 {
			return
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "layeroracle:", err)
			os.Exit(2)
		}
		var req Request
		if err := json.Unmarshal(line, &req); err != nil || req.Size < 0 || req.Size > 1<<31 {
			fmt.Fprintln(os.Stderr, "layeroracle: bad request:", string(line))
			os.Exit(2)
		}
		blob := make([]byte, req.Size)
		if _, err := io.ReadFull(in, blob); err != nil {
			fmt.Fprintln(os.Stderr, "layeroracle: short request:", err)
			os.Exit(2)
		}
		if err := enc.Encode(list(blob, unpigz)); err != nil {
			os.Exit(2)
		}
		if err := out.Flush(); err != nil {
			os.Exit(2)
		}
	}
}
