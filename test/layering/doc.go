// Package layering holds the test that keeps the module's import graph
// layered (TestLayering, run by `make lint`): which packages may import
// which is written down in the README's layout section and, as data, in
// layering_test.go. The package has no code of its own.
package layering
