# The GPU Operator's validator, driver component, as a pod shaped like the operator's
# driver-validation init container (gpu-operator assets/state-operator-validation/
# 0500_daemonset.yaml, its Role from 0200_role.yaml): privileged, the host's / at /host, the
# driver root /run/nvidia/driver at the same path, /run/nvidia/validations, /dev/char, with the
# setting docs/driver-root.md gives GPU Operator users. Sourced by hack/gpu-host/test-gpu.sh (uses its
# helpers); WITH_WAIT=false so that a failure shows at once.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: nvidia-operator-validator, namespace: $ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: nvidia-operator-validator, namespace: $ns}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [create, get, list, watch, update, patch, delete]
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: nvidia-operator-validator, namespace: $ns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: nvidia-operator-validator}
subjects: [{kind: ServiceAccount, name: nvidia-operator-validator, namespace: $ns}]
---
apiVersion: v1
kind: Pod
metadata: {name: driver-validation, namespace: $ns}
spec:
  serviceAccountName: nvidia-operator-validator
  restartPolicy: Never
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
  containers:
  - name: driver-validation
    image: talos-nvidia/gpu-operator-validator:test
    imagePullPolicy: Never
    command: ['sh', '-c']
    args: ["nvidia-validator"]
    env:
    - {name: WITH_WAIT, value: "false"}
    # docs/driver-root.md: the driver root has a dev/, so the validator would load the kernel
    # modules with chroot modprobe before making the /dev/char links, which the service makes.
    - {name: DISABLE_DEV_CHAR_SYMLINK_CREATION, value: "true"}
    - {name: COMPONENT, value: driver}
    - name: OPERATOR_NAMESPACE
      valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
    securityContext: {privileged: true}
    volumeMounts:
    - {name: host-root, mountPath: /host, readOnly: true, mountPropagation: HostToContainer}
    - {name: driver-install-dir, mountPath: /run/nvidia/driver, mountPropagation: HostToContainer}
    - {name: run-nvidia-validations, mountPath: /run/nvidia/validations, mountPropagation: Bidirectional}
    - {name: host-dev-char, mountPath: /host-dev-char}
  volumes:
  - {name: run-nvidia-validations, hostPath: {path: /run/nvidia/validations, type: DirectoryOrCreate}}
  - {name: driver-install-dir, hostPath: {path: /run/nvidia/driver}}
  - {name: host-root, hostPath: {path: /}}
  - {name: host-dev-char, hostPath: {path: /dev/char}}
EOF
vphase() { jp -n $ns pod driver-validation -o 'jsonpath={.status.phase}'; }
until_true 120 'test "$(vphase)" = Succeeded -o "$(vphase)" = Failed'
vout=$(kubectl -n $ns logs driver-validation 2>&1)
echo "$vout" >"$logs/validator.log"
echo "$vout" | tail -25 | sed 's/^/  validator: /'
check "the GPU Operator's validator (driver component) passes against /run/nvidia/driver (pod $(vphase))" test "$(vphase)" = Succeeded
if [[ -f /run/nvidia/validations/driver-ready ]]; then
	sed 's/^/  driver-ready: /' /run/nvidia/validations/driver-ready
	cp /run/nvidia/validations/driver-ready "$logs/"
fi
