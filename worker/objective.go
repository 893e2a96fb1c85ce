package worker

import (
	"context"

	"github.com/gradsync/gradsync/data"
	"github.com/gradsync/gradsync/internal/eval"
	"github.com/gradsync/gradsync/models"
	pb "github.com/gradsync/gradsync/proto/gradsync/v1"
)

// objective is what the training loop needs of a task: its data, how a
// batch is made, its loss and its evaluation. Classification (softmax
// cross-entropy, accuracy and confusion matrix) and multi-label
// (BCE-with-logits, F1 and mAP) implement it.
type objective interface {
	// shape is the model's input and output.
	shape() models.Options
	trainLen() int
	// batch fills x (n images) with training examples indices, augmented
	// for epoch where the task does so, and keeps their targets. An error
	// (a streamed image that cannot be decoded) fails the task.
	batch(indices []int, x []float32, epoch int) error
	// loss is the mean loss of the kept targets against logits (n rows)
	// and writes d(loss)/d(logits) into dlogits.
	loss(logits []float32, n int, dlogits []float32) float32
	// evaluate runs the model over the test split and fills res.
	evaluate(ctx context.Context, net forwarder, res *pb.JobResult) error
}

// forwarder is what an evaluation runs the test split through: a whole
// *models.Network, or a pipeline's stages together (pipeTask.evaluate).
type forwarder interface {
	InputSize() int
	// Forward returns the logits of x's batch samples, valid until the
	// next call (see models.Network.Forward).
	Forward(x []float32, batch int, train bool) []float32
}

// evalBatch is the batch size used for evaluation (forward only).
const evalBatch = 500

// forEachTestBatch runs net forward over n test examples in batches; fill
// writes batch [lo, lo+k) into x and see receives the logits.
func forEachTestBatch(ctx context.Context, net forwarder, n int, fill func(idx []int, x []float32), see func(idx []int, logits []float32)) error {
	inSize := net.InputSize()
	x := make([]float32, evalBatch*inSize)
	idx := make([]int, evalBatch)
	for lo := 0; lo < n; lo += evalBatch {
		if err := ctx.Err(); err != nil {
			return err
		}
		k := min(evalBatch, n-lo)
		for i := range k {
			idx[i] = lo + i
		}
		fill(idx[:k], x[:k*inSize])
		see(idx[:k], net.Forward(x[:k*inSize], k, false))
	}
	return nil
}

// classification is single-label image classification.
type classification struct {
	train, test *data.Dataset
	aug         *data.Augmenter // nil: none
	y           []int32
}

func newClassification(train, test *data.Dataset, spec *pb.JobSpec) *classification {
	c := &classification{train: train, test: test}
	if a := spec.GetDataset().GetAugment(); a == "crop" || a == "crop-flip" {
		c.aug = &data.Augmenter{Pad: 2, Flip: a == "crop-flip", Seed: spec.GetSeed()}
	}
	return c
}

func (c *classification) shape() models.Options {
	t := c.train
	return models.Options{Channels: t.C, Height: t.H, Width: t.W, Classes: t.Classes}
}

func (c *classification) trainLen() int { return c.train.Len() }

func (c *classification) batch(indices []int, x []float32, epoch int) error {
	n := len(indices)
	if cap(c.y) < n {
		c.y = make([]int32, n)
	}
	c.y = c.y[:n]
	t := c.train
	t.Batch(indices, x, c.y)
	if c.aug != nil {
		c.aug.Apply(x, n, t.C, t.H, t.W, indices, epoch, t.ZeroPixel())
	}
	return nil
}

func (c *classification) loss(logits []float32, n int, dlogits []float32) float32 {
	return models.SoftmaxCrossEntropy(logits, c.y[:n], c.train.Classes, dlogits)
}

func (c *classification) evaluate(ctx context.Context, net forwarder, res *pb.JobResult) error {
	classes := c.test.Classes
	conf := eval.NewConfusion(classes)
	y := make([]int32, evalBatch)
	pred := make([]int, evalBatch)
	var lossSum float64
	err := forEachTestBatch(ctx, net, c.test.Len(),
		func(idx []int, x []float32) { c.test.Batch(idx, x, y[:len(idx)]) },
		func(idx []int, logits []float32) {
			k := len(idx)
			lossSum += float64(models.SoftmaxCrossEntropy(logits, y[:k], classes, nil)) * float64(k)
			eval.Argmax(logits, classes, pred[:k])
			conf.AddPredictionsWide(pred[:k], y[:k])
		})
	if err != nil {
		return err
	}
	res.TestLoss = lossSum / float64(c.test.Len())
	fillConfusion(res, conf)
	return nil
}

// multiLabel is the two-digit task: each image holds two digits side by
// side and its target is the set of both.
type multiLabel struct {
	train, test *data.MultiLabelDataset
	posWeight   []float32 // (N−P)/P per class, as torch's pos_weight
	y           []float32
}

func newMultiLabel(train, test *data.MultiLabelDataset) *multiLabel {
	m := &multiLabel{train: train, test: test, posWeight: make([]float32, train.Classes)}
	for c, p := range train.PositiveCounts() {
		if p > 0 {
			m.posWeight[c] = float32(train.Len()-p) / float32(p)
		} else {
			m.posWeight[c] = 1
		}
	}
	return m
}

func (m *multiLabel) shape() models.Options {
	t := m.train
	return models.Options{Channels: t.C, Height: t.H, Width: t.W, Classes: t.Classes}
}

func (m *multiLabel) trainLen() int { return m.train.Len() }

func (m *multiLabel) batch(indices []int, x []float32, _ int) error {
	k := len(indices) * m.train.Classes
	if cap(m.y) < k {
		m.y = make([]float32, k)
	}
	m.y = m.y[:k]
	m.train.Batch(indices, x, m.y)
	return nil
}

func (m *multiLabel) loss(logits []float32, n int, dlogits []float32) float32 {
	return models.BCEWithLogits(logits, m.y[:n*m.train.Classes], m.posWeight, dlogits)
}

func (m *multiLabel) evaluate(ctx context.Context, net forwarder, res *pb.JobResult) error {
	classes := m.test.Classes
	ml := eval.NewMultiLabel(classes)
	y := make([]float32, evalBatch*classes)
	var lossSum float64
	err := forEachTestBatch(ctx, net, m.test.Len(),
		func(idx []int, x []float32) { m.test.Batch(idx, x, y[:len(idx)*classes]) },
		func(idx []int, logits []float32) {
			k := len(idx)
			lossSum += float64(models.BCEWithLogits(logits, y[:k*classes], nil, nil)) * float64(k)
			ml.Add(logits, y[:k*classes])
		})
	if err != nil {
		return err
	}
	// TestAccuracy is the exact-match (subset) accuracy; the F1 scores
	// and mAP are the task's usual figures.
	res.TestAccuracy = ml.SubsetAccuracy()
	res.TestLoss = lossSum / float64(m.test.Len())
	res.MicroF1, res.MacroF1, res.MeanAveragePrecision = ml.MicroF1(), ml.MacroF1(), ml.MAP()
	return nil
}
