package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/nodeagent/nodeagent/agent/filecheck"
	"github.com/nodeagent/nodeagent/netcfg/config"
	"github.com/nodeagent/nodeagent/netcfg/wg/pia"
)

// Regions writes the region ids of the PIA server lists cached under the
// state directory, with their names, port forwarding marked, and how old
// each list is: the lists of the config's PIA devices (their serverList
// and serverListKeyFile), or PIA's own list when the config has none or
// cannot be read. It fails when no list is cached. It writes nothing.
func Regions(w io.Writer, o Options) error {
	store := pia.StoreAt(o.StateDir)
	type source struct {
		url string
		pia config.PIA
	}
	var sources []source
	// A region typo must not hide the list that would correct it: the
	// config is read without judging regions.
	if c, err := config.LoadWith(o.Config, config.Options{SkipFileChecks: true}); err == nil {
		for _, d := range c.WireGuard {
			if d.PIA != nil && !slices.ContainsFunc(sources, func(s source) bool { return s.url == filecheck.ListURL(*d.PIA) }) {
				sources = append(sources, source{filecheck.ListURL(*d.PIA), *d.PIA})
			}
		}
	}
	if len(sources) == 0 {
		sources = []source{{url: pia.DefaultServerList}}
	}
	shown := 0
	var errs []error
	for _, s := range sources {
		key, err := filecheck.ListKey(s.pia)
		if err != nil {
			errs = append(errs, fmt.Errorf("the server list of %s: serverListKeyFile: %w", s.url, err))
			continue
		}
		l, at, err := store.LoadList(s.url, key)
		switch {
		case errors.Is(err, fs.ErrPermission):
			errs = append(errs, fmt.Errorf("the cached server list of %s under %s cannot be read: permission denied (run as root)", s.url, store.Dir))
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		case l == nil:
			continue
		}
		if shown > 0 {
			fmt.Fprintln(w)
		}
		shown++
		writeRegions(w, s.url, l, at, time.Now())
	}
	if shown == 0 {
		errs = append(errs, fmt.Errorf("no PIA server list is cached under %s: nodeagent run fetches it when it starts a PIA device (--state-dir names another state directory)", store.Dir))
	}
	return errors.Join(errs...)
}

func writeRegions(w io.Writer, url string, l *pia.List, at, now time.Time) {
	pf := 0
	for _, r := range l.Regions {
		if r.PortForward {
			pf++
		}
	}
	fmt.Fprintf(w, "PIA server list %s, cached %s (%s ago): %d regions, %d with port forwarding (PF)\n",
		url, at.UTC().Format("2006-01-02 15:04 MST"), age(now.Sub(at)), len(l.Regions), pf)
	regions := slices.Clone(l.Regions)
	slices.SortFunc(regions, func(a, b pia.Region) int { return strings.Compare(a.ID, b.ID) })
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tPF\tNAME")
	for _, r := range regions {
		mark, name := "", printable(r.Name)
		if r.PortForward {
			mark = "PF"
		}
		if r.Offline {
			name += " (offline)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r.ID, mark, name)
	}
	tw.Flush()
}

// age is d in its largest whole unit: 45s, 12m, 5h, 3d.
func age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", max(int(d/time.Second), 0))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// maxRegionName bounds a region's name as printed (PIA's are a few words).
const maxRegionName = 64

// printable is a name from the server list as it may be printed: no
// control characters (a terminal would obey them), and short.
func printable(s string) string {
	out := []rune{}
	for _, r := range s {
		if len(out) == maxRegionName {
			return string(out) + "..."
		}
		if !unicode.IsPrint(r) {
			r = '?'
		}
		out = append(out, r)
	}
	return string(out)
}
