package vm

import (
	"bytes"
	"compress/gzip"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// ensureVmlinux extracts the uncompressed kernel from the bzImage into
// k.vmlinux() unless it is already there. qemu boots such an ELF kernel
// directly through its PVH entry point, which skips the in-guest
// decompression: under TCG that takes about 7 of the 13 seconds of a boot.
func ensureVmlinux(k *kernel) error {
	if _, err := os.Stat(k.vmlinux()); err == nil {
		return nil
	}
	bz, err := os.ReadFile(k.vmlinuz())
	if err != nil {
		return err
	}
	elfData, err := extractVmlinux(bz)
	if err != nil {
		return fmt.Errorf("extract vmlinux: %w", err)
	}
	if ok, err := hasPVHNote(elfData); err != nil || !ok {
		return fmt.Errorf("extracted vmlinux has no PVH entry point (%v)", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(k.vmlinux()), ".vmlinux-")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(elfData); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), k.vmlinux())
}

// extractVmlinux returns the ELF kernel inside a bzImage, using the payload
// fields of the boot protocol (2.08 and later).
func extractVmlinux(bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || string(bz[0x202:0x206]) != "HdrS" {
		return nil, errors.New("not a bzImage")
	}
	if v := binary.LittleEndian.Uint16(bz[0x206:]); v < 0x208 {
		return nil, fmt.Errorf("boot protocol %#x has no payload fields", v)
	}
	setup := int(bz[0x1f1])
	if setup == 0 {
		setup = 4
	}
	off := (setup+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if off < 0 || n <= 4 || off+n > len(bz) {
		return nil, errors.New("payload outside the file")
	}
	payload := bz[off : off+n]
	switch {
	case bytes.HasPrefix(payload, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(bytes.NewReader(payload))
		if err != nil {
			return nil, err
		}
		zr.Multistream(false)
		return io.ReadAll(zr)
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		return pipe(payload, "xz", "-dc", "--single-stream")
	case bytes.HasPrefix(payload, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		// The build appends the uncompressed size, which zstd rejects.
		return pipe(payload[:len(payload)-4], "zstd", "-dcq")
	}
	return nil, fmt.Errorf("unsupported compression (magic % x)", payload[:4])
}

// pipe runs a decompressor on in.
func pipe(in []byte, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %s", name, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// hasPVHNote reports whether the ELF image carries the Xen
// XEN_ELFNOTE_PHYS32_ENTRY note that qemu needs to boot it.
func hasPVHNote(data []byte) (bool, error) {
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return false, err
	}
	const physEntry = 18 // XEN_ELFNOTE_PHYS32_ENTRY
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return false, err
		}
		for len(b) >= 12 {
			namesz := int(binary.LittleEndian.Uint32(b))
			descsz := int(binary.LittleEndian.Uint32(b[4:]))
			typ := binary.LittleEndian.Uint32(b[8:])
			name := (namesz + 3) &^ 3
			desc := (descsz + 3) &^ 3
			if 12+name+desc > len(b) || namesz < 0 || descsz < 0 {
				break
			}
			if typ == physEntry && string(bytes.TrimRight(b[12:12+namesz], "\x00")) == "Xen" {
				return true, nil
			}
			b = b[12+name+desc:]
		}
	}
	return false, nil
}
