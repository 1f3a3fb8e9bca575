package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// usageError is a command-line mistake: rankrunner prints it with a hint
// and exits 2 (as flag parsing in most Unix tools).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, a ...any) error { return &usageError{fmt.Errorf(format, a...)} }

// exitError carries the exit code of a finished job or subcommand.
type exitError struct {
	code int
	err  error // nil: nothing more to print
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit code %d", e.code)
	}
	return e.err.Error()
}

// noArgs rejects positional arguments as a usage error.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}
