package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// FromSpec returns a simulated node for a spec MODEL:COUNT, e.g. h200:4 (the demo's
// NVIDIA_DRIVER_SIMULATE).
func FromSpec(spec string) (*Node, error) {
	model, countText, ok := strings.Cut(spec, ":")

	count, err := strconv.Atoi(countText)
	if !ok || err != nil || count < 1 {
		return nil, fmt.Errorf("%q is not MODEL:COUNT", spec)
	}

	m, err := LookupModel(model)
	if err != nil {
		return nil, err
	}

	return New(m, count), nil
}
