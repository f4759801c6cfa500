/** The sidebar's icon: a master above three workers. */
import { LabIcon } from '@jupyterlab/ui-components';

import iconSvg from '../style/icon.svg';

export const elasticdlIcon = new LabIcon({
  name: 'elasticdl-nb:icon',
  svgstr: iconSvg
});
