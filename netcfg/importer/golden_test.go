package importer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/register"
	"github.com/nodeagent/nodeagent/netcfg/wg"
	"github.com/nodeagent/nodeagent/testenv"
)

// The golden cases are testdata/CASE/: snapshot.json (the kernel's part of
// a Snapshot), etc/ (files ReadFiles reads: wg-quick files, rt_tables,
// units), only.txt (Options.Only, one name a line), and the outputs
// want.yaml (the config) and want-files.txt (the files, steps and notes).
// NODEAGENT_UPDATE_GOLDEN=1 writes the outputs.

func loadCase(t *testing.T, dir string) (Snapshot, Options) {
	t.Helper()
	var s Snapshot
	b, err := os.ReadFile(filepath.Join(dir, "snapshot.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "etc")); err == nil {
		ReadFiles(filepath.Join(dir, "etc"), &s)
	}
	var o Options
	if b, err := os.ReadFile(filepath.Join(dir, "only.txt")); err == nil {
		o.Only = strings.Fields(string(b))
	}
	return s, o
}

// describe renders a Result's files, steps and notes for want-files.txt.
func describe(r Result) string {
	var b strings.Builder
	for _, f := range r.Files {
		fmt.Fprintf(&b, "== %s %04o\n%s", f.Path, f.Mode, f.Data)
	}
	if r.Private != "" {
		fmt.Fprintf(&b, "== %s 0600\n%s", NotesName, r.Private)
	}
	b.WriteString("== steps\n")
	for _, s := range r.Steps {
		b.WriteString(s + "\n")
	}
	b.WriteString("== notes\n")
	for _, n := range r.Notes {
		b.WriteString(n + "\n")
	}
	return b.String()
}

func golden(t *testing.T, path, got string) {
	t.Helper()
	if os.Getenv("NODEAGENT_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (NODEAGENT_UPDATE_GOLDEN=1 writes it)", err)
	}
	if diff := cmp.Diff(strings.Split(string(want), "\n"), strings.Split(got, "\n")); diff != "" {
		t.Errorf("%s differs (-want +got):\n%s", path, diff)
	}
}

func TestGolden(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no source tree (testdata)")
	}
	cases, err := filepath.Glob("testdata/*/snapshot.json")
	if err != nil || len(cases) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	for _, c := range cases {
		dir := filepath.Dir(c)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			s, o := loadCase(t, dir)
			r, err := Build(s, o)
			if err != nil {
				t.Fatalf("Build: %v\n%s", err, r.Config)
			}
			golden(t, filepath.Join(dir, "want.yaml"), string(r.Config))
			golden(t, filepath.Join(dir, "want-files.txt"), describe(r))

			again, err := Build(s, o)
			if err != nil || string(again.Config) != string(r.Config) || describe(again) != describe(r) {
				t.Errorf("a second Build differs: %v", err)
			}
			validateInstalled(t, s, o)
		})
	}
}

// TestWantValidates checks every want.yaml as it stands in testdata.
func TestWantValidates(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no source tree (testdata)")
	}
	wants, _ := filepath.Glob("testdata/*/want.yaml")
	if len(wants) == 0 {
		t.Fatal("no testdata/*/want.yaml")
	}
	for _, w := range wants {
		b, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.ParseWith(w, b, config.Options{SkipFileChecks: true}); err != nil {
			t.Errorf("%s does not validate:\n%v", w, err)
		}
	}
}

// validateInstalled builds with a temporary root, writes the files there
// as nodeagent import --out does, and checks the config with the file
// checks on, the key files with the daemon's reader, and every peersDir
// with the register's loader.
func validateInstalled(t *testing.T, s Snapshot, o Options) {
	t.Helper()
	root := t.TempDir()
	o.Root = root
	r, err := Build(s, o)
	if err != nil {
		t.Fatalf("Build at %s: %v", root, err)
	}
	if err := WriteOut(root, r); err != nil {
		t.Fatalf("WriteOut: %v", err)
	}
	c, err := config.Load(filepath.Join(root, "nodeagent.yaml"))
	if err != nil {
		t.Fatalf("the installed config does not validate:\n%v\n%s", err, r.Config)
	}
	for _, w := range c.WireGuard {
		if _, err := os.Stat(w.PrivateKeyFile); err == nil {
			if _, err := wg.ReadPrivateKeyFile(w.PrivateKeyFile); err != nil {
				t.Errorf("%s: %v", w.Name, err)
			}
		}
		if w.PeersDir == "" {
			continue
		}
		reg := register.Load(w.PeersDir, config.Options{})
		if len(reg.Errors) > 0 {
			t.Errorf("%s: peersDir: %v", w.Name, reg.Errors)
		}
		// The peer files are those straight in its peersDir (peers.d, or
		// peers.d/DEV when several devices have one).
		rel, err := filepath.Rel(root, w.PeersDir)
		if err != nil || !strings.HasPrefix(rel, "peers.d") {
			t.Errorf("%s: peersDir %s is not the package's peers.d or a directory of it", w.Name, w.PeersDir)
		}
		n := 0
		for _, f := range r.Files {
			if filepath.Dir(f.Path) == rel {
				n++
			}
		}
		if len(reg.Peers) != n {
			t.Errorf("%s: %d peers read from %d files", w.Name, len(reg.Peers), n)
		}
		for _, p := range reg.Peers {
			if p.Peer.PresharedKeyFile != "" {
				if _, err := wg.ReadKeyFile(p.Peer.PresharedKeyFile); err != nil {
					t.Errorf("%s: %v", p.File, err)
				}
			}
		}
	}
}

// TestFixedPoint imports each case again as the node looks once nodeagent
// has taken over what the first import declared (links marked, rules and
// routes of its protocol, the wg-quick units disabled, its rt_tables.d
// entry written): the config and the files are the same.
func TestFixedPoint(t *testing.T) {
	if testenv.InVM() {
		t.Skip("the host tier runs this: the VM has no source tree (testdata)")
	}
	cases, _ := filepath.Glob("testdata/*/snapshot.json")
	if len(cases) == 0 {
		t.Fatal("no testdata/*/snapshot.json")
	}
	for _, c := range cases {
		dir := filepath.Dir(c)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			s, o := loadCase(t, dir)
			first, err := Build(s, o)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := config.ParseWith("nodeagent.yaml", first.Config, config.Options{SkipFileChecks: true})
			if err != nil {
				t.Fatal(err)
			}
			owned := map[string]bool{}
			for _, v := range cfg.VLANs {
				owned[v.Name] = true
			}
			for _, m := range cfg.Macvlans {
				owned[m.Name] = true
			}
			for _, w := range cfg.WireGuard {
				owned[w.Name] = true
			}
			tables := map[int]bool{}
			names := map[int]string{}
			for _, tb := range cfg.Routing.Tables {
				tables[tb.ID] = true
				if tb.Name != "" {
					names[tb.ID] = tb.Name
				}
			}
			for i, l := range s.Links {
				if owned[l.Name] {
					s.Links[i].Alias = "nodeagent"
				}
			}
			// The rules the config declares are nodeagent's now; the
			// others (another daemon's) are as they were.
			declared := map[int]bool{}
			for _, r := range cfg.Routing.Rules {
				declared[r.Priority] = true
			}
			for i, r := range s.Rules {
				if !isDefaultRule(r) && declared[r.Priority] {
					s.Rules[i].Protocol = 147
				}
			}
			for i, r := range s.Routes {
				imported := slices.Contains([]string{"unicast", "unreachable", "blackhole", "prohibit"}, r.Type) && !r.Multipath
				if tables[r.Table] && r.Protocol != protoKernel && imported {
					s.Routes[i].Protocol = 147
				}
			}
			for id, n := range names {
				if s.TableNames == nil {
					s.TableNames = map[int]string{}
				}
				s.TableNames[id] = n
			}
			// The units are disabled; a device that was down stays
			// enabled here, standing for the device nodeagent made (this
			// snapshot has no kernel state of it).
			s.WGQuickUnits = slices.DeleteFunc(s.WGQuickUnits, func(n string) bool {
				return slices.ContainsFunc(s.Links, func(l Link) bool { return l.Name == n })
			})
			again, err := Build(s, o)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(strings.Split(string(first.Config), "\n"), strings.Split(string(again.Config), "\n")); diff != "" {
				t.Errorf("the config differs after the take-over (-first +again):\n%s", diff)
			}
			if diff := cmp.Diff(first.Files, again.Files); diff != "" {
				t.Errorf("the files differ after the take-over (-first +again):\n%s", diff)
			}
		})
	}
}
