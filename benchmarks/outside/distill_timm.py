"""Knowledge distillation as a timm user writes it, for trying gpudoctor on code it was not tuned for: a
frozen ResNet-50 teacher (random weights, no download) run under `torch.no_grad()` and a ResNet-18
student trained on the teacher's softened logits (KL divergence at temperature 4) and the labels, two
modules called every step; random images and labels made per index by a Dataset, four loader workers,
SGD with momentum and a cosine schedule, the loss printed every 20 steps. Float32. Nothing here is tuned."""

import argparse

import timm
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=100)
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--image-size", type=int, default=160)
parser.add_argument("--temperature", type=float, default=4.0)
parser.add_argument("--alpha", type=float, default=0.9)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class RandomImages(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.randn(3, args.image_size, args.image_size, generator=g)
        return image, int(torch.randint(0, 1000, (1,), generator=g))


loader = DataLoader(RandomImages(), batch_size=args.batch_size, shuffle=True, num_workers=4, drop_last=True)

teacher = timm.create_model("resnet50", pretrained=False, num_classes=1000).to(device)
teacher.eval()
student = timm.create_model("resnet18", pretrained=False, num_classes=1000).to(device)

optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs * len(loader))


def distillation_loss(student_logits, teacher_logits, labels):
    t = args.temperature
    soft = F.kl_div(
        F.log_softmax(student_logits / t, dim=-1),
        F.softmax(teacher_logits / t, dim=-1),
        reduction="batchmean",
    )
    return args.alpha * soft * t * t + (1 - args.alpha) * F.cross_entropy(student_logits, labels)


step = 0
for epoch in range(args.epochs):
    student.train()
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        with torch.no_grad():
            teacher_logits = teacher(images)
        student_logits = student(images)
        loss = distillation_loss(student_logits, teacher_logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 20 == 0:
            print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        step += 1
