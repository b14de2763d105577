"""Writes tests/golden_nn/resnet50_state_dict.txt: every entry of ResNet-50's state_dict, in order,
as `name dtype shape` (shape comma-separated, empty for 0-d). The model is bench/models_torch.py's
plain torch.nn transcription of torchvision's resnet50; where torchvision is installed, its own
resnet50 is checked to have the same entries.

Also writes tests/golden_nn/resnet_tiny.safetensors: a small ResNet of the same code (one block per
stage, width 4, 5 classes) as a checkpoint (its state_dict, running statistics perturbed, under
the names `model.<name>`) and, for images `in.x` [2, 3, 32, 32]: `out.logits_eval` (eval mode),
`out.logits_train` (train mode, batch statistics), `out.<name>` for every running statistic after
that train-mode forward.

    python3 tests/golden_nn/make_resnet50_names.py
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "bench"))
sys.argv = [sys.argv[0], "--warm-cache"]  # models_torch leaves the compiler caches alone then
import models_torch as mt  # noqa: E402


def entries(model):
    return [f"{k} {str(v.dtype).removeprefix('torch.')} {','.join(map(str, v.shape))}" for k, v in model.state_dict().items()]


def main():
    ours = entries(mt.ResNet(mt.CONFIGS["124m"]["resnet"]))
    try:
        import torchvision
        theirs = entries(torchvision.models.resnet50())
        assert ours == theirs, "the transcription differs from torchvision's resnet50"
    except ImportError:
        pass
    with open(os.path.join(here, "resnet50_state_dict.txt"), "w") as f:
        f.write("\n".join(ours) + "\n")
    print(len(ours), "entries")

    import torch
    from safetensors.torch import save_file
    torch.manual_seed(5)
    model = mt.ResNet(mt.ResNetConfig(layers=(1, 1, 1, 1), width=4, num_classes=5, batch=2, image=32))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape))
            elif name.endswith("running_var"):
                b.copy_(1 + 0.2 * torch.rand(b.shape))
            elif name.endswith("num_batches_tracked"):
                b.fill_(3)
        for name, p in model.named_parameters():
            if ".bn" in name or name.startswith("bn") or "downsample.1" in name:
                p.add_(0.1 * torch.randn(p.shape))
    out = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 32, 32)
    out["in.x"] = x
    with torch.no_grad():
        out["out.logits_eval"] = model.eval()(x)
        out["out.logits_train"] = model.train()(x)
    out.update({f"out.{k}": v.clone() for k, v in model.state_dict().items() if "running" in k or "tracked" in k})
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(here, "resnet_tiny.safetensors"))


if __name__ == "__main__":
    main()
