import torch,sys
from engine.verify import timed
from engine.verify.pipeline import CardCheck
from engine.verify.guard import Canaries
from engine.launch.launcher import prefill_,per_output
from engine.ops import call_op,resolve_op
from engine.bench.timing import L2Flusher,TimingConfig
A=resolve_op("aten::add.Tensor");N=int(sys.argv[1]);K=int(sys.argv[2]);d='cuda'
F=[0];o=timed.clone_bound
def cb(*a,**k):
 F[0]=1;return o(*a,**k)
timed.clone_bound=cb
S={'l':0,'s':0};R=[];P=['v']
C=Canaries(d)
def prep(b,pf):
 a=dict(b);t=C.empty_strided((N,),(1,),torch.float32);prefill_(t,per_output(pf,0))
 def call():
  p=t.data_ptr();S['s']=S['s']+1 if p==S['l'] else 0;S['l']=p
  ch=S['s']>=K;R.append((P[0],F[0],ch));F[0]=0
  if ch:
   h=N//2;torch.add(a['self'][:h],a['other'][:h],out=t[:h])
  else:torch.add(a['self'],a['other'],out=t)
  return [t]
 return call
def run(b,pf):
 C.forget();r=prep(b,pf)();torch.cuda.synchronize();assert not C.violations();C.forget();return r
g=torch.Generator().manual_seed(0)
sm=[[("self",torch.randn(N,generator=g).to(d)),("other",torch.randn(N,generator=g).to(d)),("alpha",1)] for _ in range(2)]
ck=CardCheck("aten::add.Tensor",sm,lambda b:call_op(A,b),sync=torch.cuda.synchronize)
for it in range(int(sys.argv[3])):
 R.clear();P[0]='v';v=ck.check(run);P[0]='t'
 if not v.ok:print('VERDICT',v.category,v.message[:200]);continue
 tr=timed.audited_ab(ck,timed.TimedCandidate(prep,after=C.enqueue_check,overran=C.pending_violation),L2Flusher(torch.device(d)),TimingConfig())
 P[0]='r';rc=ck.recheck_in_place(run,tr.slot)
 from collections import Counter
 print(N,K,'ok' if (tr.category is None and rc.ok) else 'CAUGHT',tr.category,rc.ok,'aud',tr.audited,'sp %.3f'%tr.ab.speedup,'e %.2f c %.2f'%(tr.ab.eager.median,tr.ab.candidate.median),'reps',tr.ab.reps,dict(Counter(R)),(tr.message or '')[:120],flush=True)
