package document

import (
	"fmt"
	"strings"
)

// MaxProblems is how many problems an Invalid lists; maxProblemLen bounds each. Its message
// goes into the log line and the status file: a 10 MB document of unknown keys made both
// 74 MB (issue 32).
const (
	MaxProblems   = 20
	maxProblemLen = 300
)

// Invalid is the error of a document file with problems. All of them are collected, so that a
// user fixes the file in one round, but only the first MaxProblems are kept, each cut short,
// with a count of the rest.
type Invalid struct {
	What     string // what is invalid, such as "configuration" or "MIG config"
	File     string // "" where the problems name their files themselves, or come from none
	Problems []string
	More     int // problems past the first MaxProblems

	errs []error // the problems as errors, for errors.Is and errors.As
}

// Add notes one problem.
func (v *Invalid) Add(err error) {
	if len(v.Problems) >= MaxProblems {
		v.More++

		return
	}

	msg := err.Error()
	if len(msg) > maxProblemLen {
		msg = strings.ToValidUTF8(msg[:maxProblemLen], "") + "..."
	}

	v.Problems = append(v.Problems, msg)
	v.errs = append(v.errs, err)
}

// Addf notes one problem, formatted as fmt.Errorf does (%w included).
func (v *Invalid) Addf(format string, args ...any) { v.Add(fmt.Errorf(format, args...)) }

// Err is v, or nil without problems.
func (v *Invalid) Err() error {
	if len(v.Problems) == 0 {
		return nil
	}

	return v
}

func (v *Invalid) Error() string {
	what := "invalid " + v.What
	if v.File != "" {
		what += " " + v.File
	}

	if len(v.Problems) == 1 && v.More == 0 {
		return what + ": " + v.Problems[0]
	}

	msg := fmt.Sprintf("%s (%d problems):\n  - %s", what, len(v.Problems)+v.More, strings.Join(v.Problems, "\n  - "))
	if v.More > 0 {
		msg += fmt.Sprintf("\n  - and %d more", v.More)
	}

	return msg
}

func (v *Invalid) Unwrap() []error { return v.errs }
