package vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SystemConfig describes a boot of a whole Debian system: a rootfs built
// with mmdebstrap, systemd as PID 1, Debian's kernel, under qemu (TCG).
// Where Run puts test binaries under a busybox /init, BootSystem is for
// testing what only a real init can show: a .deb's maintainer scripts, a
// unit's sd_notify, watchdog and sandboxing.
//
// The initramfs is three concatenated archives, which the kernel unpacks in
// order: the rootfs (cached in CacheDir, keyed by suite and package list),
// the kernel modules (DefaultModules plus Modules, with their dependencies,
// installed but not loaded: udev and the kernel's own autoloading load
// them) and Overlay, the test's own files. The kernel is started with
// rdinit=/lib/systemd/systemd; the test is a unit in Overlay that prints to
// /dev/ttyS0 and powers the system off.
type SystemConfig struct {
	// Suite is the Debian suite (default bookworm, the one whose kernel
	// apt resolves here).
	Suite string
	// Packages are passed to mmdebstrap --include (variant minbase).
	Packages []string
	// Modules are installed in addition to DefaultModules.
	Modules []string
	// Overlay is a directory whose tree is unpacked over the rootfs.
	Overlay string
	// CacheDir holds the kernel and the rootfs archives (default
	// DefaultCacheDir()).
	CacheDir string
	// MemoryMiB and CPUs size the VM (default 2048 and 2).
	MemoryMiB, CPUs int
	// Timeout bounds the boot and the test (default 10m).
	Timeout time.Duration
	// Console receives each line of the serial console.
	Console func(line string)
	// Log receives progress notes (default os.Stderr).
	Log io.Writer
	// Init is the kernel's rdinit, the first program (default
	// /lib/systemd/systemd); an Overlay's script that picks a root and
	// then runs systemd, say.
	Init string
	// DiskMiB, when set, gives the VM a blank ext4 disk of that size as
	// /dev/vda (made on the host with mkfs.ext4, labelled "vmroot"),
	// which keeps what is written to it across the guest's reboots.
	DiskMiB int
	// Reboots is how many times the guest may reboot: qemu then starts it
	// again with the same kernel, initramfs and disk. One more reboot (a
	// panic loop) ends the run with an error. Default 0: a reboot ends
	// the run as a power-off does.
	Reboots int
}

// SystemResult tells where the time went.
type SystemResult struct {
	KernelVersion string
	// Rootfs is the time to get the rootfs archive (near zero when cached).
	Rootfs time.Duration
	// Boot is the time qemu ran.
	Boot        time.Duration
	InitrdBytes int64
}

// rootfsFormat changes whenever the way the rootfs archive is made changes,
// so that stale cache entries are not reused.
const rootfsFormat = "1"

// BootSystem builds (or reuses) the rootfs, adds the modules and the
// overlay, and boots it until the system powers off or cfg.Timeout passes.
func BootSystem(ctx context.Context, cfg SystemConfig) (*SystemResult, error) {
	if cfg.Suite == "" {
		cfg.Suite = "bookworm"
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.Console == nil {
		cfg.Console = func(string) {}
	}
	vc := Config{CacheDir: cfg.CacheDir, Log: cfg.Log, Out: io.Discard, ExtraModules: cfg.Modules,
		MemoryMiB: cfg.MemoryMiB, CPUs: cfg.CPUs, Append: "rdinit=" + cmp.Or(cfg.Init, "/lib/systemd/systemd") + " systemd.show_status=0"}
	vc.setDefaults()
	res := &SystemResult{}

	k, err := fetchKernel(ctx, &vc)
	if err != nil {
		return res, fmt.Errorf("kernel: %w", err)
	}
	res.KernelVersion = k.version

	start := time.Now()
	rootfs, err := systemRootfs(ctx, &vc, cfg.Suite, cfg.Packages)
	if err != nil {
		return res, fmt.Errorf("rootfs: %w", err)
	}
	res.Rootfs = time.Since(start)

	stage, err := os.MkdirTemp("", "sysvm-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(stage)
	modRoot := filepath.Join(stage, "modules")
	if _, err := installModules(ctx, &vc, k, modRoot); err != nil {
		return res, fmt.Errorf("modules: %w", err)
	}
	// Debian's /lib is a symlink to usr/lib; put the tree where it
	// resolves rather than have the archive's lib/ meet the symlink.
	if err := os.MkdirAll(filepath.Join(modRoot, "usr"), 0o755); err != nil {
		return res, err
	}
	if err := os.Rename(filepath.Join(modRoot, "lib"), filepath.Join(modRoot, "usr", "lib")); err != nil {
		return res, err
	}
	modArchive := filepath.Join(stage, "modules.cpio.gz")
	if err := writeInitramfs(modRoot, modArchive); err != nil {
		return res, fmt.Errorf("modules archive: %w", err)
	}
	overlayArchive := filepath.Join(stage, "overlay.cpio.gz")
	if err := writeInitramfs(cfg.Overlay, overlayArchive); err != nil {
		return res, fmt.Errorf("overlay archive: %w", err)
	}
	initrd := filepath.Join(stage, "initrd")
	if err := concat(initrd, rootfs, modArchive, overlayArchive); err != nil {
		return res, err
	}
	if fi, err := os.Stat(initrd); err == nil {
		res.InitrdBytes = fi.Size()
	}

	args := qemuArgs(&vc, k, initrd)
	if cfg.DiskMiB > 0 {
		disk := filepath.Join(stage, "disk.img")
		if out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "vmroot", disk, strconv.Itoa(cfg.DiskMiB)+"M").CombinedOutput(); err != nil {
			return res, fmt.Errorf("disk: mkfs.ext4: %v: %s", err, bytes.TrimSpace(out))
		}
		args = append(args, "-drive", "file="+disk+",if=virtio,format=raw")
	}
	if cfg.Reboots > 0 {
		args = slices.DeleteFunc(args, func(a string) bool { return a == "-no-reboot" })
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", args...)
	cmd.WaitDelay = 5 * time.Second
	cmd.Stderr = vc.Log
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	start = time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("start qemu (install qemu-system-x86): %w", err)
	}
	br := bufio.NewReaderSize(stdout, 64<<10)
	reboots := 0
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			cfg.Console(strings.TrimRight(line, "\r\n"))
			// The kernel's last words before a reset.
			if strings.Contains(line, "reboot: Restarting system") {
				if reboots++; reboots > cfg.Reboots {
					cfg.Console(fmt.Sprintf("vm: reboot %d of at most %d: stopping the vm", reboots, cfg.Reboots))
					cancel()
				}
			}
		}
		if err != nil {
			break
		}
	}
	werr := cmd.Wait()
	res.Boot = time.Since(start)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return res, fmt.Errorf("boot: the vm timed out after %v and was killed", cfg.Timeout)
	}
	if reboots > cfg.Reboots {
		return res, fmt.Errorf("boot: the guest rebooted %d times, at most %d allowed", reboots, cfg.Reboots)
	}
	if werr != nil {
		return res, fmt.Errorf("boot: qemu: %w", werr)
	}
	return res, nil
}

// systemRootfs returns the cached rootfs archive for suite and packages,
// building it first if needed: mmdebstrap writes a tarball, which is
// converted to a gzip'ed newc cpio archive without the documentation.
func systemRootfs(ctx context.Context, cfg *Config, suite string, packages []string) (string, error) {
	pkgs := slices.Clone(packages)
	slices.Sort(pkgs)
	sum := sha256.Sum256([]byte(rootfsFormat + "\n" + suite + "\n" + strings.Join(pkgs, ",")))
	out := filepath.Join(cfg.CacheDir, "rootfs-"+suite+"-"+hex.EncodeToString(sum[:8])+".cpio.gz")
	if _, err := os.Stat(out); err == nil {
		cfg.debugf("vmtest: using cached rootfs %s", out)
		return out, nil
	}
	if err := os.MkdirAll(cfg.CacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cfg.CacheDir, ".tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	tarball := filepath.Join(tmp, "rootfs.tar")
	cfg.logf("vmtest: building the %s rootfs with mmdebstrap (%s) into %s", suite, strings.Join(pkgs, ","), cfg.CacheDir)
	if _, err := command(ctx, "", "mmdebstrap", "--quiet", "--variant=minbase",
		"--include="+strings.Join(pkgs, ","), suite, tarball); err != nil {
		return "", fmt.Errorf("mmdebstrap (install mmdebstrap): %w", err)
	}
	archive := filepath.Join(tmp, "rootfs.cpio.gz")
	if err := tarToCpio(tarball, archive); err != nil {
		return "", fmt.Errorf("convert %s: %w", tarball, err)
	}
	if err := os.Rename(archive, out); err != nil {
		return "", err
	}
	return out, nil
}

// droppedTrees are left out of the rootfs archive (their directories stay,
// so that packages installing there later work): they take space in the
// VM's memory and no test reads them.
var droppedTrees = []string{"usr/share/doc/", "usr/share/man/", "usr/share/locale/", "usr/share/info/", "var/cache/apt/", "var/lib/apt/lists/"}

// tarToCpio converts a tarball to a gzip'ed newc cpio archive, keeping
// owners, modes and device nodes. Hard links become symlinks to the first
// name, which is all a test system needs.
func tarToCpio(tarball, out string) error {
	in, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer in.Close()
	return writeCpioGz(out, func(cw *cpioWriter) error {
		tr := tar.NewReader(in)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			name := strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")
			name = strings.TrimSuffix(name, "/")
			if name == "" || name == "." {
				continue
			}
			perm := uint32(h.Mode & 0o7777)
			uid, gid := uint32(h.Uid), uint32(h.Gid)
			dropped := false
			for _, d := range droppedTrees {
				if strings.HasPrefix(name, d) {
					dropped = true
				}
			}
			switch h.Typeflag {
			case tar.TypeDir:
				err = cw.addOwned(name, cpioDir|perm, nil, 0, 0, uid, gid)
			case tar.TypeReg:
				if dropped {
					continue
				}
				data, rerr := io.ReadAll(tr)
				if rerr != nil {
					return rerr
				}
				err = cw.addOwned(name, cpioRegular|perm, data, 0, 0, uid, gid)
			case tar.TypeSymlink:
				err = cw.addOwned(name, cpioSymlink|0o777, []byte(h.Linkname), 0, 0, uid, gid)
			case tar.TypeLink:
				if dropped {
					continue
				}
				target := "/" + strings.TrimPrefix(strings.TrimPrefix(h.Linkname, "./"), "/")
				err = cw.addOwned(name, cpioSymlink|0o777, []byte(target), 0, 0, uid, gid)
			case tar.TypeChar:
				err = cw.addOwned(name, cpioChar|perm, nil, uint32(h.Devmajor), uint32(h.Devminor), uid, gid)
			case tar.TypeBlock:
				err = cw.addOwned(name, cpioBlock|perm, nil, uint32(h.Devmajor), uint32(h.Devminor), uid, gid)
			case tar.TypeFifo:
				err = cw.addOwned(name, cpioFifo|perm, nil, 0, 0, uid, gid)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// More cpio file types.
const (
	cpioBlock = 0o060000
	cpioFifo  = 0o010000
)

// concat writes the files one after the other to out: the kernel unpacks
// concatenated (separately compressed) cpio archives in order.
func concat(out string, files ...string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, name := range files {
		in, err := os.Open(name)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, in)
		in.Close()
		if err != nil {
			return err
		}
	}
	return f.Close()
}
