// Command piastub runs the PIA stand-in of package piastub as a process,
// for the package VM test (packaging/debvm_test.go), where the daemon runs
// under systemd in the VM's own namespace and no Go test drives it, and for
// running PIA's own client scripts against it by hand.
//
//	piastub DIR
//
// It starts the stub in namespaces of its own, links it to the calling
// namespace (100.64.0.1/30 here, a route to the stub's addresses), writes
// into DIR the files a config names to trust it (env: their paths, as
// shell assignments, and the names of the stub's namespaces; pia.cred:
// its account, 0600), then "ready", and every 200 ms "counts"
// (addKey=N tokens=N). It runs until SIGTERM or SIGINT, then removes its
// namespaces and its link here. A setup that fails removes whatever it
// made before it exits non-zero.
//
// Its namespaces are named under /run/netns, so that ip-netns(8) and
// others see them. Started under `ip netns exec NS` (or in any mount
// namespace that is not the host's), those names would be bind mounts in
// that command's private mount namespace, seen by nobody else and gone
// with it; so it first re-executes itself in the host's mount namespace
// (pid 1's; where that is out of reach, the first that names its network
// namespace under /run/netns, else its nearest ancestor's, or its session
// leader's, that differs from its own), in the same network namespace. DIR is then read in that mount namespace. Where it cannot
// enter it, it says so and stops.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// reentered marks the process that hostMountNS re-executed, so that it
// never loops.
const reentered = "PIASTUB_REENTERED_MOUNT_NS"

func main() {
	if err := hostMountNS(); err != nil {
		log.Fatalf("piastub: %v", err)
	}
	t := testenv.NewTool("piastub")
	t.Out = func(s string) { log.Print(s) }
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: piastub DIR")
		os.Exit(2)
	}
	testenv.NamePrefix = "na-piastub-"
	dir := flag.Arg(0)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	// From here on a signal ends the stub through its cleanups, also
	// while it is being set up.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if err := t.Run(func() error { return serve(t, dir, sig) }); err != nil {
		log.Fatalf("piastub: %v", err)
	}
}

// hostMountNS re-executes the program in the host's mount namespace when
// it runs in another one. The host's is pid 1's; where that cannot be
// read (a sandbox), it is the first of the program's ancestors, then its
// session leader, in a mount namespace other than the program's own.
// setns(CLONE_NEWNS) needs a thread that shares no filesystem state, so
// this thread unshares its own and execs from it; the network namespace
// is kept.
func hostMountNS() error {
	if os.Getenv(reentered) != "" {
		return os.Unsetenv(reentered)
	}
	own, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("own mount namespace: %w", err)
	}
	target := hostMountNSPath(own)
	if target == "" {
		return nil
	}
	refuse := func(err error) error {
		return fmt.Errorf("started in a mount namespace of its own (as `ip netns exec` makes), where the names of its namespaces would be seen by nobody else, and cannot enter %s: %w; start it as `nsenter --net=/run/netns/NS piastub DIR` instead", target, err)
	}
	wd, _ := os.Getwd()
	fd, err := unix.Open(target, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return refuse(err)
	}
	// This thread leaves the process's filesystem state behind and is
	// never handed back: it execs, or the program exits.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return refuse(fmt.Errorf("unshare CLONE_FS: %w", err))
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
		return refuse(fmt.Errorf("setns: %w", err))
	}
	// setns moved this thread to the namespace's root; the directory a
	// relative DIR names is the same path there.
	if wd != "" {
		unix.Chdir(wd)
	}
	// Exec the binary by its own inode (/proc/self/exe is a magic link,
	// good in any mount namespace), under the name it was started by.
	env := append(os.Environ(), reentered+"=1")
	return refuse(syscall.Exec("/proc/self/exe", os.Args, env))
}

// initMountNS is pid 1's mount namespace; PIASTUB_INIT_MNT_NS points it
// elsewhere, for the tests of a sandbox where pid 1 is out of reach.
func initMountNS() string {
	if p := os.Getenv("PIASTUB_INIT_MNT_NS"); p != "" {
		return p
	}
	return "/proc/1/ns/mnt"
}

// hostMountNSPath is the path of the host's mount namespace (see
// hostMountNS), "" if it is own or none is found.
func hostMountNSPath(own string) string {
	if l, err := os.Readlink(initMountNS()); err == nil {
		if l == own {
			return ""
		}
		return initMountNS()
	}
	var pids []int
	for pid := os.Getppid(); pid > 1 && len(pids) < 64; pid = parent(pid) {
		pids = append(pids, pid)
	}
	if sid, err := unix.Getsid(0); err == nil && sid > 1 {
		pids = append(pids, sid)
	}
	// Best: a mount namespace that names the network namespace this runs
	// in under /run/netns, which is where `ip netns exec NAME` was typed;
	// it is found whether or not the process that typed it is still there
	// (a stub started with `&` from a script that has ended).
	if p := namingMountNS(own, pids); p != "" {
		return p
	}
	for _, pid := range pids {
		p := fmt.Sprintf("/proc/%d/ns/mnt", pid)
		if l, err := os.Readlink(p); err == nil && l != own {
			return p
		}
	}
	return ""
}

// namingMountNS is the mount namespace, other than own, of the first
// process (first, then every other by pid) whose /run/netns holds a name
// for this process's network namespace; "" if there is none.
func namingMountNS(own string, first []int) string {
	var self unix.Stat_t
	if unix.Stat("/proc/self/ns/net", &self) != nil {
		return ""
	}
	pids := append([]int(nil), first...)
	if ents, err := os.ReadDir("/proc"); err == nil {
		for _, e := range ents {
			if pid, err := strconv.Atoi(e.Name()); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	seen := map[string]bool{own: true}
	for _, pid := range pids {
		p := fmt.Sprintf("/proc/%d/ns/mnt", pid)
		l, err := os.Readlink(p)
		if err != nil || seen[l] {
			continue
		}
		seen[l] = true
		dir := fmt.Sprintf("/proc/%d/root/run/netns", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			var st unix.Stat_t
			if unix.Stat(filepath.Join(dir, e.Name()), &st) == nil && st.Dev == self.Dev && st.Ino == self.Ino {
				return p
			}
		}
	}
	return ""
}

// parent is pid's parent, 0 if unknown.
func parent(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// cmdErr runs a command and returns its error with its output.
func cmdErr(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func serve(t *testenv.Tool, dir string, sig <-chan os.Signal) error {
	s := piastub.Start(t, piastub.Options{})
	// The caller's namespace is the node's: a veth to the stub's WAN side.
	la := netlink.NewLinkAttrs()
	la.Name = "tostub"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wan0", PeerNamespace: netlink.NsFd(s.NS.Handle)}); err != nil {
		return fmt.Errorf("veth tostub: %w", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("tostub"); err == nil {
			netlink.LinkDel(l)
		}
	})
	for _, c := range []string{"ip addr add 100.64.0.1/30 dev tostub", "ip link set tostub up", "ip route add " + piastub.Prefix.String() + " via 100.64.0.2"} {
		if err := cmdErr(strings.Fields(c)...); err != nil {
			return err
		}
	}
	for _, c := range []string{"ip link set wan0 up", "ip addr add 100.64.0.2/30 dev wan0", "ip route add default via 100.64.0.1"} {
		if out, err := s.NS.TryExec(strings.Fields(c)...); err != nil {
			return fmt.Errorf("%s in %s: %w\n%s", c, s.NS.Name, err, out)
		}
	}
	f := s.WriteFiles(dir)
	s.Creds(filepath.Join(dir, "pia.cred"))
	env := fmt.Sprintf("PIA_CA=%s\nPIA_WEBCA=%s\nPIA_LISTKEY=%s\nPIA_TOKEN_URL=%s\nPIA_LIST_URL=%s\nPIA_REGION=stub_ams\nPIA_STUB_NS=%s\nPIA_INET_NS=%s\n",
		f.CAFile, f.WebCAFile, f.ServerListKeyFile, f.TokenURL, f.ServerList, s.NS.Name, s.Inet.Name)
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644); err != nil {
		return err
	}
	t.Cleanup(func() { os.Remove(filepath.Join(dir, "ready")) })
	log.Printf("piastub: serving in %s; files in %s", s.NS.Name, dir)

	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			return nil
		case <-tick.C:
			c := fmt.Sprintf("addKey=%d tokens=%d\n", s.AddKeys(), s.Tokens())
			if err := errors.Join(os.WriteFile(filepath.Join(dir, ".counts"), []byte(c), 0o644),
				os.Rename(filepath.Join(dir, ".counts"), filepath.Join(dir, "counts"))); err != nil {
				return err
			}
		}
	}
}
