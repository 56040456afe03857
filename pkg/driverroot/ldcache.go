package driverroot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The "new" ld.so.cache format (glibc >= 2.32 writes only this one):
// a 48-byte header, then nlibs 24-byte entries whose key and value are offsets of
// NUL-terminated strings from the start of the file.
const (
	ldCacheMagic      = "glibc-ld.so.cache1.1"
	ldCacheHeaderSize = 48
	ldCacheEntrySize  = 24
)

// ParseLdCache returns the library names an ld.so.cache lists and the path of each (the
// first entry wins, as in the loader).
func ParseLdCache(data []byte) (map[string]string, error) {
	if len(data) < ldCacheHeaderSize || !bytes.HasPrefix(data, []byte(ldCacheMagic)) {
		return nil, errors.New("not an ld.so.cache in the glibc-ld.so.cache1.1 format")
	}

	n := binary.LittleEndian.Uint32(data[20:24])
	if uint64(ldCacheHeaderSize)+uint64(n)*ldCacheEntrySize > uint64(len(data)) {
		return nil, fmt.Errorf("truncated: %d entries do not fit in %d bytes", n, len(data))
	}

	str := func(off uint32) (string, error) {
		if int(off) >= len(data) {
			return "", fmt.Errorf("string offset %d out of range", off)
		}

		end := bytes.IndexByte(data[off:], 0)
		if end < 0 {
			return "", fmt.Errorf("unterminated string at offset %d", off)
		}

		return string(data[off : int(off)+end]), nil
	}

	libs := make(map[string]string, n)

	for i := range n {
		e := data[ldCacheHeaderSize+i*ldCacheEntrySize:]

		key, err := str(binary.LittleEndian.Uint32(e[4:8]))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}

		value, err := str(binary.LittleEndian.Uint32(e[8:12]))
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}

		if _, seen := libs[key]; !seen {
			libs[key] = value
		}
	}

	return libs, nil
}
