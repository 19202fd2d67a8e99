package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strings"
	"unicode"
)

// renderSchema renders the config schema from the source of package config:
// a section per struct reachable from Config (in the order the fields name
// them), an item per field with its YAML key, its type and its doc comment.
func renderSchema(file string) (string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.ParseComments)
	if err != nil {
		return "", err
	}
	types := map[string]*ast.TypeSpec{}
	docs := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE {
			continue
		}
		for _, s := range g.Specs {
			ts := s.(*ast.TypeSpec)
			types[ts.Name.Name] = ts
			text := ts.Doc.Text()
			if text == "" && len(g.Specs) == 1 {
				text = g.Doc.Text()
			}
			docs[ts.Name.Name] = text
		}
	}
	if _, ok := types["Config"]; !ok {
		return "", fmt.Errorf("%s: no type Config", file)
	}
	var b strings.Builder
	type section struct{ typ, path string }
	queue := []section{{"Config", ""}}
	seen := map[string]bool{}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if seen[s.typ] {
			continue
		}
		seen[s.typ] = true
		st, ok := types[s.typ].Type.(*ast.StructType)
		if !ok {
			return "", fmt.Errorf("type %s is not a struct", s.typ)
		}
		if s.path != "" {
			fmt.Fprintf(&b, ".SS %s\n", escape(s.path))
			if d := typeDoc(s.typ, docs[s.typ]); d != "" {
				b.WriteString(prose(d) + "\n")
			}
		}
		for _, fld := range st.Fields.List {
			key := yamlKey(fld)
			if key == "" {
				continue
			}
			path := key
			if s.path != "" {
				path = s.path + "." + key
			}
			typ, elem, list := describe(fld.Type)
			if elem != "" && types[elem] != nil {
				sub := path
				if list {
					sub += "[]"
				}
				queue = append(queue, section{elem, sub})
				typ += ", see " + sub
			}
			fmt.Fprintf(&b, ".TP\n\\fB%s\\fR (%s)\n", escape(key), escape(typ))
			text := strings.TrimSpace(fld.Doc.Text() + " " + fld.Comment.Text())
			if text != "" && len(fld.Names) == 1 {
				text = fieldDoc(fld.Names[0].Name, key, text)
				b.WriteString(prose(text) + "\n")
			}
		}
	}
	return b.String(), nil
}

// yamlKey is the field's yaml tag name; "" for fields without one or
// tagged "-".
func yamlKey(f *ast.Field) string {
	if f.Tag == nil {
		return ""
	}
	tag := reflect.StructTag(strings.Trim(f.Tag.Value, "`")).Get("yaml")
	name, _, _ := strings.Cut(tag, ",")
	if name == "-" {
		return ""
	}
	return name
}

// describe names a field's type the way a YAML author sees it, and returns
// the named struct type it holds (if any) and whether it is a list of it.
func describe(e ast.Expr) (desc, elem string, list bool) {
	switch t := e.(type) {
	case *ast.StarExpr:
		return describe(t.X)
	case *ast.ArrayType:
		d, el, _ := describe(t.Elt)
		return "list of " + plural(d), el, true
	case *ast.MapType:
		k, _, _ := describe(t.Key)
		v, _, _ := describe(t.Value)
		return "map of " + k + " to " + v, "", false
	case *ast.SelectorExpr:
		if x, ok := t.X.(*ast.Ident); ok && x.Name == "time" && t.Sel.Name == "Duration" {
			return "duration, such as 1s or 2m", "", false
		}
		return t.Sel.Name, "", false
	case *ast.Ident:
		switch t.Name {
		case "string":
			return "string", "", false
		case "bool":
			return "boolean", "", false
		case "int", "int32", "int64", "uint", "uint16", "uint32":
			return "integer", "", false
		}
		return "mapping", t.Name, false
	}
	return fmt.Sprintf("%T", e), "", false
}

func plural(d string) string {
	switch d {
	case "string":
		return "strings"
	case "integer":
		return "integers"
	case "mapping":
		return "mappings"
	}
	return d
}

// typeDoc turns a type's doc comment ("VLAN is an 802.1Q sub-interface")
// into a sentence about the section ("An 802.1Q sub-interface").
func typeDoc(name, text string) string {
	text = strings.Join(strings.Fields(text), " ")
	for _, verb := range []string{" is ", " are ", " configures ", " identifies "} {
		if rest, ok := strings.CutPrefix(text, name+verb); ok {
			if verb == " is " || verb == " are " {
				return upperFirst(rest)
			}
			return "Configures " + rest
		}
	}
	return text
}

// fieldDoc turns a field's doc comment, which by Go convention starts with
// the Go name ("Adopt takes over ..."), into one that starts with the YAML
// key, and folds it onto one line.
func fieldDoc(goName, key, text string) string {
	text = strings.Join(strings.Fields(text), " ")
	if rest, ok := strings.CutPrefix(text, goName+" "); ok {
		return key + " " + rest
	}
	// Left as written: a comment that starts with a value (an enum's
	// "bridge") must keep the spelling the validator accepts.
	return text
}

func upperFirst(s string) string {
	for i, r := range s {
		return string(unicode.ToUpper(r)) + s[i+len(string(r)):]
	}
	return s
}
