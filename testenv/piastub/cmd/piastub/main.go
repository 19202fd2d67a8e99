// Command piastub runs the PIA stand-in of package piastub as a process,
// for the package VM test (packaging/debvm_test.go), where the daemon runs
// under systemd in the VM's own namespace and no Go test drives it.
//
//	piastub DIR
//
// It starts the stub in namespaces of its own, links it to the calling
// namespace (100.64.0.1/30 here, a route to the stub's addresses), writes
// into DIR the files a config names to trust it (env: their paths, as
// shell assignments; pia.cred: its account, 0600), then "ready", and
// every 200 ms "counts" (addKey=N tokens=N). It runs until SIGTERM or
// SIGINT, then removes its namespaces.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodeagent/nodeagent/testenv"
	"github.com/nodeagent/nodeagent/testenv/piastub"
	"github.com/vishvananda/netlink"
)

func main() {
	t := testenv.NewTool("piastub")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: piastub DIR")
		os.Exit(2)
	}
	dir := flag.Arg(0)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		log.Fatal(err)
	}
	err := t.Run(func() error { return serve(t, dir) })
	if err != nil {
		log.Fatal(err)
	}
}

func serve(t *testenv.Tool, dir string) error {
	s := piastub.Start(t, piastub.Options{})
	// The caller's namespace is the node's: a veth to the stub's WAN side.
	la := netlink.NewLinkAttrs()
	la.Name = "tostub"
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "wan0", PeerNamespace: netlink.NsFd(s.NS.Handle)}); err != nil {
		log.Fatalf("veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName("tostub"); err == nil {
			netlink.LinkDel(l)
		}
	})
	for _, c := range []string{"ip addr add 100.64.0.1/30 dev tostub", "ip link set tostub up", "ip route add " + piastub.Prefix.String() + " via 100.64.0.2"} {
		if out, err := exec.Command(strings.Fields(c)[0], strings.Fields(c)[1:]...).CombinedOutput(); err != nil {
			log.Fatalf("%s: %v\n%s", c, err, out)
		}
	}
	for _, c := range []string{"ip link set wan0 up", "ip addr add 100.64.0.2/30 dev wan0", "ip route add default via 100.64.0.1"} {
		s.NS.Exec(t, strings.Fields(c)...)
	}
	f := s.WriteFiles(dir)
	s.Creds(filepath.Join(dir, "pia.cred"))
	env := fmt.Sprintf("PIA_CA=%s\nPIA_WEBCA=%s\nPIA_LISTKEY=%s\nPIA_TOKEN_URL=%s\nPIA_LIST_URL=%s\nPIA_REGION=stub_ams\n",
		f.CAFile, f.WebCAFile, f.ServerListKeyFile, f.TokenURL, f.ServerList)
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(env), 0o644); err != nil {
		log.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644)
	log.Printf("piastub: serving; files in %s", dir)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sig:
			return nil
		case <-tick.C:
			c := fmt.Sprintf("addKey=%d tokens=%d\n", s.AddKeys(), s.Tokens())
			os.WriteFile(filepath.Join(dir, ".counts"), []byte(c), 0o644)
			os.Rename(filepath.Join(dir, ".counts"), filepath.Join(dir, "counts"))
		}
	}
}
