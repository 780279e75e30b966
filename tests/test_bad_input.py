"Loading: bad checkpoints get a clear error naming the problem, and nothing half-built is returned."
import json, shutil
import pytest, torch
from safetensors.torch import load_file, save_file
from nanoserve.core import ModelNotFound, WeightsError, ConfigError
from nanoserve.model import load_model
from nanoserve.generate import ReferenceLM

def copy(src, dst):
    shutil.copytree(src, dst)
    return dst

def test_directory_without_config(tiny, tmp_path):
    d = copy(tiny('llama_tied_gqa'), tmp_path/'m')
    (d/'config.json').unlink()
    with pytest.raises(ModelNotFound, match="has no config.json"): load_model(d)

def test_missing_directory(tmp_path):
    with pytest.raises(ModelNotFound, match="does not exist"): load_model(tmp_path/'nope')

def test_truncated_safetensors(tiny, tmp_path):
    d = copy(tiny('llama_untied_mha'), tmp_path/'m')
    f = d/'model.safetensors'
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
    with pytest.raises(WeightsError, match="may be truncated"): load_model(d)

def test_wrong_shaped_tensor(tiny, tmp_path):
    d = copy(tiny('llama_untied_mha'), tmp_path/'m')
    sd = load_file(d/'model.safetensors')
    sd['model.layers.1.mlp.up_proj.weight'] = torch.zeros(17, 64)
    save_file(sd, d/'model.safetensors')
    with pytest.raises(WeightsError, match=r"model.layers.1.mlp.up_proj.weight: checkpoint \(17, 64\), model \(160, 64\)"): load_model(d)

def test_missing_and_unexpected_tensors_listed_together(tiny, tmp_path):
    d = copy(tiny('llama_untied_mha'), tmp_path/'m')
    sd = load_file(d/'model.safetensors')
    del sd['lm_head.weight']
    sd['model.layers.0.self_attn.q_norm.weight'] = torch.ones(16)
    save_file(sd, d/'model.safetensors')
    with pytest.raises(WeightsError) as e: load_model(d)
    assert 'missing (1): lm_head.weight' in str(e.value) and 'unexpected (1): model.layers.0.self_attn.q_norm.weight' in str(e.value)

def test_unknown_architecture(tiny, tmp_path):
    d = copy(tiny('llama_tied_gqa'), tmp_path/'m')
    cfg = json.loads((d/'config.json').read_text())
    (d/'config.json').write_text(json.dumps({**cfg, 'architectures': ['Gemma3ForCausalLM']}))
    with pytest.raises(ConfigError, match=r"unsupported architectures \['Gemma3ForCausalLM'\]"): load_model(d)

@pytest.mark.parametrize('field,value,message', [
    ('rope_parameters', {'rope_type': 'yarn', 'factor': 4.0, 'rope_theta': 1e4}, "'yarn' is not supported"),
    ('hidden_act', 'gelu_pytorch_tanh', "hidden_act='gelu_pytorch_tanh'"),
    ('quantization_config', {'quant_method': 'gptq'}, 'quantization_config'),
])
def test_unsupported_fields_are_named(tiny, tmp_path, field, value, message):
    d = copy(tiny('llama_tied_gqa'), tmp_path/'m')
    cfg = json.loads((d/'config.json').read_text())
    (d/'config.json').write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ConfigError, match=message): load_model(d)

def test_no_weights_file(tiny, tmp_path):
    d = copy(tiny('llama_tied_gqa'), tmp_path/'m')
    (d/'model.safetensors').unlink()
    with pytest.raises(ModelNotFound, match="has no model.safetensors"): load_model(d)

def test_sharded_checkpoint_loads(tiny, tmp_path):
    "The index form of a checkpoint loads, and a missing shard is named."
    import transformers
    src = tiny('llama_untied_mha')
    hf = transformers.AutoModelForCausalLM.from_pretrained(src)
    d = tmp_path/'sharded'
    hf.save_pretrained(d, max_shard_size='100KB')
    assert (d/'model.safetensors.index.json').is_file()
    m = load_model(d)
    ref = load_model(src)
    for (n, a), (_, b) in zip(m.named_parameters(), ref.named_parameters()): assert torch.equal(a, b), n
    shard = sorted(d.glob('model-*.safetensors'))[-1]
    shard.unlink()
    with pytest.raises(WeightsError, match=f"names shard\\(s\\) that are not in .*{shard.name}"): load_model(d)

