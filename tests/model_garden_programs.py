"""TF Model Garden 2.20 (tf-models-official) programs, built from its configs and factories at tiny
sizes with random weights. Each builder returns (fn, args, options) for `library_corpus.check_program`.

Model Garden is written for Keras 2 (it imports tf_keras itself), so nothing is rerouted here.
"""
import numpy as np
import tensorflow as tf
import tf_keras

BATCH = 2


def _seed(seed=0):
  tf_keras.utils.set_random_seed(seed)


def _ints(shape, high, seed):
  return np.random.RandomState(seed).randint(0, high, shape).astype(np.int32)


def _floats(shape, seed, scale=1.0):
  return (scale * np.random.RandomState(seed).normal(size=shape)).astype(np.float32)


def _encoder_inputs(seq, vocab, seed=3):
  words = _ints((BATCH, seq), vocab, seed)
  mask = np.ones((BATCH, seq), np.int32)
  mask[1, seq - 3:] = 0
  return words, mask, _ints((BATCH, seq), 2, seed + 1)


# --- NLP encoders -------------------------------------------------------------------------------

def _nlp_encoder(network, vocab=50, seq=12):
  words, mask, types = _encoder_inputs(seq, vocab)
  network(dict(input_word_ids=words, input_mask=mask, input_type_ids=types))

  def fn(words, mask, types):
    out = network(dict(input_word_ids=words, input_mask=mask, input_type_ids=types), training=False)
    return (out["sequence_output"], out["pooled_output"]) if isinstance(out, dict) else tuple(out)
  return fn, (words, mask, types), {}


def bert_encoder():
  """BertEncoderV2: 2 transformer layers, width 32."""
  from official.nlp.modeling import networks
  _seed()
  return _nlp_encoder(networks.BertEncoderV2(vocab_size=50, hidden_size=32, num_layers=2, num_attention_heads=4,
                                             max_sequence_length=16, type_vocab_size=2, inner_dim=64))


def albert_encoder():
  """AlbertEncoder: factorized embedding (width 16) and one shared transformer layer applied twice."""
  from official.nlp.modeling import networks
  _seed()
  return _nlp_encoder(networks.AlbertEncoder(vocab_size=50, embedding_width=16, hidden_size=32, num_layers=2,
                                             num_attention_heads=4, max_sequence_length=16, type_vocab_size=2,
                                             intermediate_size=64))


def mobilebert_encoder():
  """MobileBERTEncoder: 2 bottleneck blocks with stacked feed-forward networks, no_norm layers."""
  from official.nlp.modeling import networks
  _seed()
  network = networks.MobileBERTEncoder(word_vocab_size=50, word_embed_size=16, type_vocab_size=2,
                                       max_sequence_length=16, num_blocks=2, hidden_size=32, num_attention_heads=4,
                                       intermediate_size=32, intra_bottleneck_size=16, num_feedforward_networks=2)
  return _nlp_encoder(network)


def fnet_encoder():
  """FNet: Fourier token mixing (tf.signal.fft2d) in place of attention, 2 layers."""
  from official.nlp.modeling import networks
  _seed()
  return _nlp_encoder(networks.FNet(vocab_size=50, hidden_size=32, num_layers=2, num_attention_heads=4,
                                    max_sequence_length=12, type_vocab_size=2, inner_dim=64, use_fft=True))


# --- seq2seq ------------------------------------------------------------------------------------

def _seq2seq(beam_size, padded_decode=False):
  from official.nlp.modeling.models import seq2seq_transformer as s2s
  _seed()
  encoder = s2s.TransformerEncoder(num_layers=1, num_attention_heads=2, intermediate_size=32)
  decoder = s2s.TransformerDecoder(num_layers=1, num_attention_heads=2, intermediate_size=32)
  return s2s.Seq2SeqTransformer(vocab_size=30, embedding_width=16, beam_size=beam_size, decode_max_length=6,
                                encoder_layer=encoder, decoder_layer=decoder, eos_id=1, alpha=0.6,
                                padded_decode=padded_decode)


def seq2seq_transformer_train():
  """The seq2seq Transformer's teacher-forced logits (a training forward)."""
  model = _seq2seq(beam_size=2)
  inputs, targets = _ints((BATCH, 7), 28, 5) + 2, _ints((BATCH, 5), 28, 6) + 2
  inputs[:, -1], targets[:, -1] = 0, 0
  fn = lambda inputs, targets: model(dict(inputs=inputs, targets=targets))
  fn(inputs, targets)
  return fn, (inputs, targets), {}


def _beam_search(padded_decode):
  model = _seq2seq(beam_size=3, padded_decode=padded_decode)
  inputs = np.clip(_ints((BATCH, 7), 30, 5), 2, None)
  inputs[1, -2:] = 0
  fn = lambda inputs: model(dict(inputs=inputs))
  fn(inputs)
  return fn, (inputs,), dict(grad=False)


def seq2seq_transformer_beam_search():
  """Unpadded beam search (beam 3): the while loop grows its self-attention cache by concatenation."""
  return _beam_search(padded_decode=False)


def seq2seq_transformer_padded_beam_search():
  """Padded beam search (beam 3): a preallocated cache written at the loop step (TPU style)."""
  return _beam_search(padded_decode=True)


def t5_transformer():
  """T5 encoder-decoder (relative position buckets, gated GELU), teacher-forced logits."""
  from official.nlp.modeling.models import t5
  _seed()
  config = t5.T5TransformerParams(num_layers=2, d_model=16, d_kv=8, num_heads=2, d_ff=32, vocab_size=40,
                                  ffn_activations=("gelu", "linear"), logits_via_embedding=False,
                                  relative_attention_num_buckets=8, relative_attention_max_distance=16)
  model = t5.T5Transformer(config)
  enc, dec_in, dec_target = _ints((BATCH, 9), 40, 7) + 1, _ints((BATCH, 6), 40, 8) + 1, _ints((BATCH, 6), 40, 9) + 1

  def fn(enc, dec_in, dec_target):
    return model(encoder_input_tokens=enc, decoder_input_tokens=dec_in, decoder_target_tokens=dec_target,
                 training=False)["logits"]
  fn(*map(tf.constant, (enc, dec_in, dec_target)))
  return fn, (enc, dec_in, dec_target), {}


# --- vision ---------------------------------------------------------------------------------------

def _image(size, seed=11):
  return _floats((BATCH, size, size, 3), seed)


def _small_resnet(backbone, model_id=18):
  backbone.type = "resnet"
  backbone.resnet.model_id = model_id


def retinanet():
  """RetinaNet (ResNet-18 + FPN, levels 3-7) with its multilevel detection generator (v2 NMS)."""
  from official.vision.configs import retinanet as cfg
  from official.vision.modeling import factory
  _seed()
  config = cfg.RetinaNet(num_classes=4, input_size=[128, 128, 3])
  _small_resnet(config.backbone)
  config.decoder.fpn.num_filters = 16
  config.head.num_filters, config.head.num_convs = 16, 1
  config.detection_generator.max_num_detections = 10
  config.detection_generator.pre_nms_top_k = 50
  model = factory.build_retinanet(tf_keras.layers.InputSpec(shape=[None, 128, 128, 3]), config)
  images = _image(128)
  model(images, image_shape=np.array([[128, 128]] * BATCH, np.int32), training=False)

  def fn(images):
    out = model(images, image_shape=tf.constant([[128, 128]] * BATCH, tf.int32), training=False)
    return {k: out[k] for k in ("detection_boxes", "detection_scores", "detection_classes", "num_detections")}

  def train_fn(images):
    out = model(images, training=True)
    return out["cls_outputs"], out["box_outputs"]
  return fn, (images,), dict(grad=False, train_fn=train_fn)


def maskrcnn():
  """Mask R-CNN (ResNet-18 + FPN): RPN, proposal NMS, multilevel ROI align, box and mask heads; its
  gradient is of the detections (boxes, scores, masks) through ROI align and both heads."""
  from official.vision.configs import maskrcnn as cfg
  from official.vision.modeling import factory
  _seed()
  config = cfg.MaskRCNN(num_classes=4, input_size=[128, 128, 3], min_level=2, max_level=5)
  _small_resnet(config.backbone)
  config.anchor.num_scales = 1
  config.decoder.fpn.num_filters = 16
  config.rpn_head.num_filters, config.rpn_head.num_convs = 16, 1
  config.detection_head.num_filters, config.detection_head.num_convs, config.detection_head.num_fcs = 16, 1, 1
  config.detection_head.fc_dims = 32
  config.mask_head.num_filters, config.mask_head.num_convs = 16, 1
  config.roi_generator.test_num_proposals = 20
  config.roi_generator.test_pre_nms_top_k = 100
  config.detection_generator.max_num_detections = 8
  config.detection_generator.pre_nms_top_k = 50
  model = factory.build_maskrcnn(tf_keras.layers.InputSpec(shape=[None, 128, 128, 3]), config)
  images = _image(128)
  from official.vision.ops import anchor
  anchors = anchor.build_anchor_generator(min_level=2, max_level=5, num_scales=1, aspect_ratios=[0.5, 1.0, 2.0],
                                          anchor_size=8)(image_size=(128, 128))
  anchors = {k: np.tile(v.numpy()[None], [BATCH, 1, 1, 1]) for k, v in anchors.items()}
  shape = np.array([[128, 128]] * BATCH, np.int32)
  model(images, shape, anchors, training=False)
  for v in model.variables:   # the RPN's scores init at stddev 1e-5: all 0.5, their order decided by ulps
    if "rpn-scores" in v.name and "kernel" in v.name:
      v.assign(_floats(v.shape, 21, 0.1))

  def fn(images):
    out = model(images, tf.constant(shape), {k: tf.constant(v) for k, v in anchors.items()}, training=False)
    return {k: out[k] for k in ("detection_boxes", "detection_scores", "detection_classes", "num_detections",
                                "detection_masks")}
  return fn, (images,), dict(grad=True)


def segmentation():
  """DeepLabV3+: ResNet-18 backbone, ASPP decoder at stride 32, fused with stride-8 features in the head."""
  from official.vision.configs import semantic_segmentation as cfg
  from official.vision.modeling import factory
  _seed()
  config = cfg.SemanticSegmentationModel(num_classes=5, input_size=[64, 64, 3], min_level=3, max_level=5)
  _small_resnet(config.backbone)
  config.decoder.type = "aspp"
  config.decoder.aspp.level, config.decoder.aspp.num_filters = 5, 16
  config.decoder.aspp.dilation_rates = [2, 4]
  config.head.level, config.head.num_convs, config.head.num_filters = 5, 1, 16
  config.head.feature_fusion, config.head.low_level, config.head.low_level_num_filters = "deeplabv3plus", 3, 8
  model = factory.build_segmentation_model(tf_keras.layers.InputSpec(shape=[None, 64, 64, 3]), config)
  images = _image(64)
  model(images, training=False)
  fn = lambda images: model(images, training=False)["logits"]
  return fn, (images,), dict(train_fn=lambda images: model(images, training=True)["logits"])


# --- Image classification backbones ---------------------------------------------------------------

def _classifier(backbone, size):
  """Model Garden's ClassificationModel (global pool + dense) over `backbone`, inference mode."""
  from official.vision.modeling import classification_model
  model = classification_model.ClassificationModel(backbone, num_classes=5)
  images = _image(size)
  model(images, training=False)
  return (lambda images: model(images, training=False)), (images,), {}


def _input_spec(size):
  return tf_keras.layers.InputSpec(shape=[None, size, size, 3])


def mobilenet_v4_hybrid():
  """MobileNetV4-Hybrid-Medium at width 1/4: UIB blocks, fused IB, and mobile multi-query attention."""
  from official.vision.modeling.backbones import mobilenet
  _seed()
  return _classifier(mobilenet.MobileNet("MobileNetV4HybridMedium", input_specs=_input_spec(64),
                                         filter_size_scale=0.25), 64)


def mobiledet():
  """MobileDet-CPU at width 1/4: inverted bottlenecks with squeeze-excite and hard-swish."""
  from official.vision.modeling.backbones import mobiledet as mobiledet_backbone
  _seed()
  return _classifier(mobiledet_backbone.MobileDet("MobileDetCPU", input_specs=_input_spec(64),
                                                  filter_size_scale=0.25), 64)


def spinenet():
  """SpineNet-49 at width 1/4, levels 3-5: scale-permuted blocks resampled between levels."""
  from official.vision.modeling.backbones import spinenet as spinenet_backbone
  _seed()
  return _classifier(spinenet_backbone.SpineNet(
      input_specs=_input_spec(64), min_level=3, max_level=5, filter_size_scale=0.25, resample_alpha=0.5,
      endpoints_num_filters=32), 64)


def spinenet_mobile():
  """SpineNet-Mobile (levels 3-5, width 1/4): SpineNet's permuted blocks as inverted bottlenecks."""
  from official.vision.modeling.backbones import spinenet_mobile as spinenet_mobile_backbone
  _seed()
  return _classifier(spinenet_mobile_backbone.SpineNetMobile(
      input_specs=_input_spec(64), min_level=3, max_level=5, filter_size_scale=0.25, expand_ratio=3,
      endpoints_num_filters=16), 64)


def vision_transformer():
  """ViT: 16x16 patches of a 64x64 image, 2 layers of width 32, class token."""
  from official.vision.modeling.backbones import vit
  _seed()
  return _classifier(vit.VisionTransformer(mlp_dim=64, num_heads=2, num_layers=2, hidden_size=32, patch_size=16,
                                           input_specs=_input_spec(64), representation_size=0), 64)


def resnet_rs():
  """ResNet-RS-50 at depth 1/4: ResNet-D shortcuts (average pool), a strided conv for the stem pool,
  squeeze-excite."""
  from official.vision.modeling.backbones import resnet
  _seed()
  return _classifier(resnet.ResNet(model_id=50, input_specs=_input_spec(64), depth_multiplier=0.25, stem_type="v1",
                                   resnetd_shortcut=True, replace_stem_max_pool=True, se_ratio=0.25), 64)


def _movinet(causal, external_states):
  from official.projects.movinet.modeling import movinet, movinet_model
  _seed()
  backbone = movinet.Movinet(model_id="a0", causal=causal, conv_type="2plus1d" if causal else "3d",
                             se_type="2plus3d" if causal else "3d", use_external_states=external_states,
                             use_positional_encoding=causal)
  return movinet_model.MovinetClassifier(backbone, num_classes=6, output_states=causal)


def movinet_a0():
  """MoViNet-A0 video classifier (3D convs, squeeze-excite) on 4 frames of 64x64."""
  model = _movinet(causal=False, external_states=False)
  video = _floats((1, 4, 64, 64, 3), 13)
  model(video, training=False)
  return lambda video: model(video, training=False), (video,), {}


def movinet_a0_stream():
  """MoViNet-A0 streaming: causal (2+1)D convs; two frames in, the states out, fed to the next call."""
  model = _movinet(causal=True, external_states=True)
  video = _floats((1, 2, 64, 64, 3), 14)
  init_states = model.init_states(tf.shape(video))
  state_names = sorted(init_states)
  model(dict(image=video, **init_states), training=False)

  def fn(video, *states):
    logits, new_states = model(dict(image=video, **dict(zip(state_names, states))), training=False)
    return logits, [new_states[k] for k in state_names]
  return fn, (video, *[s.numpy() for s in (init_states[k] for k in state_names)]), {}


def yolo():
  """YOLOv4-style detector (CSP-Darknet tiny, YOLO decoder/head) with its detection generator."""
  from official.core import exp_factory
  from official.projects.yolo.common import registry_imports  # noqa: F401 - registers the YOLO configs
  from official.projects.yolo.modeling import factory
  _seed()
  config = exp_factory.get_exp_config("yolo_darknet").task.model
  config.num_classes = 4
  config.input_size = [64, 64, 3]
  config.backbone.darknet.model_id = "cspdarknettiny"
  config.decoder.yolo_decoder.version, config.decoder.yolo_decoder.type = "v4", "tiny"
  config.backbone.darknet.max_level, config.backbone.darknet.min_level = 5, 4
  config.detection_generator.max_boxes = 10
  config.detection_generator.pre_nms_points = 50
  model, _ = factory.build_yolo(tf_keras.layers.InputSpec(shape=[None, 64, 64, 3]), config, None)
  images = _image(64)
  model(images, training=False)

  def fn(images):
    out = model(images, training=False)
    return {k: out[k] for k in ("bbox", "classes", "confidence", "num_detections")}
  return fn, (images,), dict(grad=False, train_fn=lambda images: model(images, training=True)["raw_output"])


CORPUS = {f.__name__: f for f in [
  bert_encoder, albert_encoder, mobilebert_encoder, fnet_encoder, seq2seq_transformer_train,
  seq2seq_transformer_beam_search, seq2seq_transformer_padded_beam_search, t5_transformer, retinanet, maskrcnn,
  segmentation, movinet_a0, movinet_a0_stream, yolo, mobilenet_v4_hybrid, mobiledet, spinenet, spinenet_mobile,
  vision_transformer, resnet_rs]}
