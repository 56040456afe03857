# Cluster-side targets (deploy/, docs/). The top-level Makefile includes this file:
#   include hack/dev/deploy.mk

.PHONY: deploy-tools deploy-render deploy-lint deploy-test

# helm and kustomize (built from the Go module proxy, pinned in hack/dev/tools/go.mod) and
# promtool (from Debian's prometheus package) into _out/tools.
deploy-tools:
	bash hack/dev/install-deploy-test-deps.sh

# Regenerate what deploy/ derives from its sources: the rendered device plugin chart
# (from deploy/device-plugin/values.yaml), the PrometheusRule (from
# deploy/monitoring/gpu.rules.yaml) and the Grafana dashboards.
deploy-render: deploy-tools
	go test ./deploy -count=1 -run 'TestDevicePluginRenderedChartIsCurrent|TestPrometheusRuleMatchesRulesFile|TestSharingComponentsAreCurrent' -update
	go run ./hack/dev/gen-dashboards -out deploy/monitoring/dashboards

# promtool on the rules and their unit tests, kustomize on every manifest set.
deploy-lint: deploy-tools
	_out/tools/promtool check rules deploy/monitoring/gpu.rules.yaml
	_out/tools/promtool test rules deploy/monitoring/tests/gpu.rules.test.yaml
	_out/tools/kustomize build deploy >/dev/null
	_out/tools/kustomize build deploy/monitoring >/dev/null

deploy-test: deploy-tools
	go test -count=1 ./deploy/... ./docs/... ./pkg/nfd/...
