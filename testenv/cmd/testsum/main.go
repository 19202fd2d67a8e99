// Command testsum reads `go test -v` logs (the host run and the VM run) and
// prints one summary for all of them, ending with the line
// "N passed, N failed, N skipped". It exits 1 when any test or package
// failed, or when a log holds no test at all.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

var (
	result  = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+)`)
	pkgFail = regexp.MustCompile(`^(FAIL\s+\S+|panic: |FAIL$)`)
)

type counts struct{ pass, fail, skip, pkgFail int }

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsum LOG...")
		os.Exit(2)
	}
	var total counts
	var failed []string
	bad := false
	fmt.Println("\n== test summary")
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testsum: %v\n", err)
			os.Exit(2)
		}
		var c counts
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if m := result.FindStringSubmatch(line); m != nil {
				switch m[1] {
				case "PASS":
					c.pass++
				case "FAIL":
					c.fail++
					failed = append(failed, path+": "+m[2])
				case "SKIP":
					c.skip++
				}
			} else if pkgFail.MatchString(line) {
				c.pkgFail++
				failed = append(failed, path+": "+strings.TrimSpace(line))
			}
		}
		f.Close()
		fmt.Printf("%-28s %4d passed, %d failed, %d skipped\n", path+":", c.pass, c.fail, c.skip)
		if c.pass+c.fail == 0 {
			fmt.Printf("%s: ran no test\n", path)
			bad = true
		}
		total.pass += c.pass
		total.fail += c.fail
		total.skip += c.skip
		total.pkgFail += c.pkgFail
	}
	for _, f := range failed {
		fmt.Println("failed:", f)
	}
	fmt.Printf("%d passed, %d failed, %d skipped\n", total.pass, total.fail, total.skip)
	if bad || total.fail > 0 || total.pkgFail > 0 {
		os.Exit(1)
	}
}
