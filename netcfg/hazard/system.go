package hazard

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"unicode"
)

// System is what networkd and udevd read of the node besides their files:
// whether they run, their version, and what the conditions of a [Match]
// section (Host=, Virtualization=, KernelCommandLine=, Architecture=,
// Credential=, KernelVersion=, Firmware=) test.
type System struct {
	// Networkd reports whether systemd-networkd runs: it owns its bus
	// name, org.freedesktop.network1.
	Networkd bool
	// Udev reports whether udevd runs (systemd's udev_available(): /sys
	// is read-write): networkd then takes each link's udev device, whose
	// DEVTYPE is its Type= and whose properties Path= and Property= test.
	Udev bool
	// Ifupdown reports whether ifupdown is installed (/sbin/ifup): its
	// stanzas matter only then.
	Ifupdown bool
	// Version is the major version of the node's systemd (PID 1's, which
	// networkd and udevd come with); 0 when not known: the newest rules.
	Version int
	// Hostname is the kernel's host name, MachineID /etc/machine-id.
	Hostname, MachineID string
	// Virtualization is systemd's name for it (qemu, kvm, docker, ...),
	// "" for none; VirtualizationKnown false when it could not be learnt,
	// and then a Virtualization= condition is taken to hold.
	Virtualization      string
	VirtualizationKnown bool
	// UserNS reports whether networkd runs in a user namespace
	// (Virtualization=private-users).
	UserNS bool
	// Architecture is systemd's name for the kernel's architecture
	// (x86-64, arm64, ...), Native that of the programs' build; "" when
	// not known.
	Architecture, Native string
	// KernelCmdline is /proc/cmdline, KernelRelease uname's release.
	KernelCmdline, KernelRelease string
	// UEFI and DeviceTree are the firmware Firmware= tests.
	UEFI, DeviceTree bool
	// NetworkdUser is the user networkd runs as (systemd-network): it
	// reads its .network files as that user, and a file it may not read
	// fails to load. Nil: root.
	NetworkdUser *User
}

// User is a user's identity, for file permissions.
type User struct {
	UID  uint32
	GIDs []uint32
}

func (s System) networkdReader() reader {
	if s.NetworkdUser == nil {
		return asRoot
	}
	return reader{uid: s.NetworkdUser.UID, gids: s.NetworkdUser.GIDs}
}

// ReadSystem fills what the node's files say (Root for tests): host name,
// machine id, kernel command line and release, firmware, whether /sys is
// writable, the systemd-network user. What only the service manager knows
// (whether networkd runs, systemd's version, the virtualization and the
// architecture) is the caller's to set, from systemd over D-Bus.
func (p Paths) ReadSystem() System {
	var s System
	s.Hostname, _ = os.Hostname()
	if p.Root != "" {
		s.Hostname = firstLine(p.path("etc/hostname"))
	}
	s.MachineID = firstLine(p.path("etc/machine-id"))
	if b, err := os.ReadFile(p.path("proc/cmdline")); err == nil {
		s.KernelCmdline = strings.TrimSpace(string(b))
	}
	s.KernelRelease = firstLine(p.path("proc/sys/kernel/osrelease"))
	_, err := os.Stat(p.path("sys/firmware/efi"))
	s.UEFI = err == nil
	_, err = os.Stat(p.path("sys/firmware/devicetree"))
	s.DeviceTree = err == nil
	// udevd listens on its control socket while it runs; where /sys is
	// read-only (a container), it does not run, and that is what
	// networkd's udev_available() tests. nodeagent's own /sys is
	// read-only in its sandbox, so its own mounts say nothing.
	s.Udev = exists(p.path("run/udev/control"))
	s.Ifupdown = exists(p.path("sbin/ifup")) || exists(p.path("usr/sbin/ifup"))
	s.Native = goArch()
	s.NetworkdUser = lookupUser(p, "systemd-network")
	return s
}

func firstLine(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		return strings.TrimSpace(sc.Text())
	}
	return ""
}

// lookupUser reads a user and its groups from /etc/passwd and /etc/group.
func lookupUser(p Paths, name string) *User {
	pw, err := os.ReadFile(p.path("etc/passwd"))
	if err != nil {
		return nil
	}
	var u *User
	for _, line := range strings.Split(string(pw), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 4 && f[0] == name {
			uid, err1 := strconv.ParseUint(f[2], 10, 32)
			gid, err2 := strconv.ParseUint(f[3], 10, 32)
			if err1 == nil && err2 == nil {
				u = &User{UID: uint32(uid), GIDs: []uint32{uint32(gid)}}
			}
			break
		}
	}
	if u == nil {
		return nil
	}
	if gr, err := os.ReadFile(p.path("etc/group")); err == nil {
		for _, line := range strings.Split(string(gr), "\n") {
			f := strings.Split(line, ":")
			if len(f) < 4 {
				continue
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == name {
					if gid, err := strconv.ParseUint(f[2], 10, 32); err == nil {
						u.GIDs = append(u.GIDs, uint32(gid))
					}
				}
			}
		}
	}
	return u
}

// goArch is systemd's name for this program's architecture.
func goArch() string {
	switch runtime.GOARCH {
	case "amd64":
		return "x86-64"
	case "386":
		return "x86"
	case "arm64":
		return "arm64"
	case "arm":
		return "arm"
	case "ppc64le":
		return "ppc64-le"
	case "ppc64":
		return "ppc64"
	case "s390x":
		return "s390x"
	case "riscv64":
		return "riscv64"
	case "loong64":
		return "loongarch64"
	case "mips64le":
		return "mips64-le"
	}
	return ""
}

// architectures are the names systemd's architecture_from_string() knows
// (basic/architecture.c); any other Architecture= holds on no machine.
var architectures = map[string]bool{
	"x86": true, "x86-64": true, "ppc": true, "ppc-le": true, "ppc64": true, "ppc64-le": true,
	"ia64": true, "parisc": true, "parisc64": true, "s390": true, "s390x": true, "sparc": true,
	"sparc64": true, "mips": true, "mips-le": true, "mips64": true, "mips64-le": true, "alpha": true,
	"arm": true, "arm-be": true, "arm64": true, "arm64-be": true, "sh": true, "sh64": true, "m68k": true,
	"tilegx": true, "cris": true, "nios2": true, "riscv32": true, "riscv64": true, "arc": true,
	"arc-be": true, "loongarch64": true,
}

// virtualization ids systemd knows (basic/virt.c), by class.
var (
	vmIDs        = []string{"kvm", "amazon", "qemu", "bochs", "xen", "uml", "vmware", "oracle", "microsoft", "zvm", "parallels", "bhyve", "qnx", "acrn", "powervm", "apple", "sre", "google", "vm-other"}
	containerIDs = []string{"systemd-nspawn", "lxc-libvirt", "lxc", "openvz", "docker", "podman", "rkt", "wsl", "proot", "pouch", "container-other"}
)

// condition is one condition of a [Match] section.
type condition struct {
	key, param string
	negate     bool
}

// holds evaluates c as systemd's condition_test() does for the condition
// types a [Match] section may carry; a fact the System does not know makes
// it hold (a hazard is reported rather than missed).
func (s System) holds(c condition, p Paths, credentialsDir string) bool {
	r := true
	switch c.key {
	case "Host":
		if id, ok := parseID128(c.param); ok {
			r = s.MachineID == "" || strings.EqualFold(id, s.MachineID)
		} else {
			r = s.Hostname == "" || fnmatch(c.param, s.Hostname, true)
		}
	case "Virtualization":
		r = s.virtualization(c.param)
	case "KernelCommandLine":
		r = cmdlineHas(s.KernelCmdline, c.param)
	case "Architecture":
		switch {
		case s.Architecture == "":
		case c.param == "native":
			r = s.Native == "" || s.Architecture == s.Native
		default:
			r = architectures[c.param] && c.param == s.Architecture
		}
	case "Credential":
		r = credentialValid(c.param) && credentialsDir != "" && exists(p.path(credentialsDir, c.param))
	case "KernelVersion":
		r = s.KernelRelease == "" || kernelVersion(c.param, s.KernelRelease)
	case "Firmware":
		switch {
		case c.param == "uefi":
			r = s.UEFI
		case c.param == "device-tree":
			r = s.DeviceTree
		}
	}
	return r != c.negate
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (s System) virtualization(param string) bool {
	if param == "private-users" {
		return s.UserNS
	}
	if !s.VirtualizationKnown {
		return true
	}
	v := s.Virtualization
	if b, ok := parseBoolean(param); ok {
		return b == (v != "")
	}
	switch param {
	case "vm":
		return contains(vmIDs, v)
	case "container":
		return contains(containerIDs, v)
	}
	return v != "" && param == v
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// parseID128 accepts a machine id as sd_id128_from_string() does: 32 hex
// digits, or a UUID with dashes; it returns the 32 digits.
func parseID128(s string) (string, bool) {
	if len(s) == 36 && s[8] == '-' && s[13] == '-' && s[18] == '-' && s[23] == '-' {
		s = s[:8] + s[9:13] + s[14:18] + s[19:23] + s[24:]
	}
	if len(s) != 32 {
		return "", false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return "", false
		}
	}
	return strings.ToLower(s), true
}

// cmdlineHas is condition_test_kernel_command_line(): a parameter with
// '=' matches a word exactly; one without matches the word or the word's
// name before its '='.
func cmdlineHas(cmdline, param string) bool {
	words, _ := extractWords(cmdline, wordsMatch)
	equal := strings.Contains(param, "=")
	for _, w := range words {
		if equal {
			if w == param {
				return true
			}
		} else if rest, ok := strings.CutPrefix(w, param); ok && (rest == "" || rest[0] == '=') {
			return true
		}
	}
	return false
}

// credentialValid is credential_name_valid(): a valid file name.
func credentialValid(s string) bool {
	return s != "" && s != "." && s != ".." && !strings.Contains(s, "/") && len(s) <= 255
}

// kernelVersion is condition_test_kernel_version(): words, each an
// optional operator and a version (or glob), all holding.
func kernelVersion(param, release string) bool {
	words, bad := extractWords(param, wordsMatch)
	if bad || len(words) == 0 {
		return false
	}
	for i := 0; i < len(words); i++ {
		w := words[i]
		op := ""
		for _, o := range []string{"$=", "!$=", "<>", "<=", ">=", "<", ">", "==", "=", "!="} {
			if strings.HasPrefix(w, o) {
				op, w = o, w[len(o):]
				break
			}
		}
		w = strings.TrimLeft(w, whitespace)
		if w == "" {
			if i > 0 || i+1 >= len(words) {
				return false
			}
			i++
			w = words[i]
		}
		var ok bool
		switch op {
		case "", "$=":
			ok = fnmatch(w, release, false)
		case "!$=":
			ok = !fnmatch(w, release, false)
		case "=":
			ok = release == w
		case "!=":
			ok = release != w
		default:
			c := versionCompare(release, w)
			ok = map[string]bool{"<>": c != 0, "<=": c <= 0, ">=": c >= 0, "<": c < 0, ">": c > 0, "==": c == 0}[op]
		}
		if !ok {
			return false
		}
	}
	return true
}

// versionCompare orders versions by their runs of digits (as numbers)
// and of other characters (as text), '~' before anything; close enough to
// systemd's strverscmp_improved() for kernel releases.
func versionCompare(a, b string) int {
	for a != "" || b != "" {
		switch {
		case strings.HasPrefix(a, "~") || strings.HasPrefix(b, "~"):
			if !strings.HasPrefix(a, "~") {
				return 1
			}
			if !strings.HasPrefix(b, "~") {
				return -1
			}
			a, b = a[1:], b[1:]
			continue
		case a == "":
			return -1
		case b == "":
			return 1
		}
		da, db := unicode.IsDigit(rune(a[0])), unicode.IsDigit(rune(b[0]))
		if da != db {
			if da {
				return 1
			}
			return -1
		}
		ra, rb := run(a, da), run(b, db)
		if da {
			na := strings.TrimLeft(ra, "0")
			nb := strings.TrimLeft(rb, "0")
			if len(na) != len(nb) {
				if len(na) < len(nb) {
					return -1
				}
				return 1
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
		} else if c := strings.Compare(ra, rb); c != 0 {
			return c
		}
		a, b = a[len(ra):], b[len(rb):]
	}
	return 0
}

func run(s string, digits bool) string {
	i := 0
	for i < len(s) && unicode.IsDigit(rune(s[i])) == digits && s[i] != '~' {
		i++
	}
	return s[:i]
}
