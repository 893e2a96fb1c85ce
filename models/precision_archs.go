package models

// lowPrecisionChecked are the architectures whose bf16 and fp16 outputs
// and gradients are checked against fp32 within stated bounds
// (TestPrecisionOutputs). resnet18, se-resnet8, mobilenet(-0.5) and
// convvit are not: measured on 2026-12-01 their low-precision gradients
// fall outside those bounds (mobilenet bf16 gradient cosine 0.63 against
// fp32), so a job may not run them below fp32 until that is understood.
var lowPrecisionChecked = map[string]bool{
	"logreg": true, "mlp": true, "lenet5": true, "cnn": true, "fedcnn": true, "resnet8": true, "vit-tiny": true,
}

// LowPrecisionChecked reports whether the named architecture may run in
// bf16 or fp16.
func LowPrecisionChecked(name string) bool { return lowPrecisionChecked[name] }
